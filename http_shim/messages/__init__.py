"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) over the engine.

request.py turns a Messages body into a chat GenerateRequest (with the readers the APIs share),
response.py builds the message object, events.py writes the event stream, errors.py gives errors
Anthropic's shape, routes.py registers the routes on the app.
"""

from .routes import is_anthropic_request, register_messages

__all__ = ["is_anthropic_request", "register_messages"]
