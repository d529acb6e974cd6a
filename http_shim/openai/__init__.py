"""OpenAI's chat completions and completions APIs over the engine.

request.py validates a body and builds the engine's GenerateRequests, response.py writes the whole
response objects and the chunk stream, routes.py registers the routes on the app.
"""

from .routes import GENERATION_ROUTES, register_openai

__all__ = ["GENERATION_ROUTES", "register_openai"]
