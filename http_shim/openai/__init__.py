"""OpenAI's chat completions and completions APIs: typed requests (protocol.py), the engine's requests
built from them (request.py), whole responses and chunks (response.py), the routes (routes.py)."""

from .routes import GENERATION_ROUTES, register_openai

__all__ = ["GENERATION_ROUTES", "register_openai"]
