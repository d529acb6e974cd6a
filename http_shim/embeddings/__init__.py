"""OpenAI's POST /v1/embeddings and vLLM's /tokenize and /detokenize over the engine: docs/embeddings.md."""

from .routes import register_embeddings

__all__ = ["register_embeddings"]
