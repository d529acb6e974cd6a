"""OpenAI's embeddings API (POST /v1/embeddings) and vLLM's /tokenize and /detokenize over the engine.

protocol.py declares the typed requests (their checks and their part of /openapi.json), request.py
builds an EmbedRequest from one, response.py writes OpenAI's list of embedding objects (float lists
or base64 of little-endian float32), routes.py registers the routes.
"""

from .routes import register_embeddings

__all__ = ["register_embeddings"]
