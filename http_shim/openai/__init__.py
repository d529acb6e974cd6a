"""OpenAI's chat completions and completions APIs over the engine.

protocol.py declares the typed requests (their checks and their part of /openapi.json), request.py
builds the engine's GenerateRequests from them, response.py writes the whole response objects and the
chunk stream, routes.py registers the routes on the app.
"""

from .routes import GENERATION_ROUTES, register_openai

__all__ = ["GENERATION_ROUTES", "register_openai"]
