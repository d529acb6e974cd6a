"""OpenAI's embeddings API (POST /v1/embeddings) and vLLM's /tokenize and /detokenize over the engine.

request.py reads and checks a body into an EmbedRequest, response.py writes OpenAI's list of
embedding objects (float lists or base64 of little-endian float32), routes.py registers the routes,
openapi.py describes them in /openapi.json.
"""

from .routes import register_embeddings

__all__ = ["register_embeddings"]
