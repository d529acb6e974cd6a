"""OpenAI-compatible HTTP front end for the Conduit engine.

Holds no model and imports no torch: it validates OpenAI JSON, calls the engine over gRPC,
and relays the answer as OpenAI JSON or server-sent events.
"""
