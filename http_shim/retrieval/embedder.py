"""The embedding model's engine, as retrieval uses it: its window, a text's token strings (for
chunking) and vectors (for chunks and queries). The model is `--retrieval-model` (all-MiniLM-L6-v2 by
default, the one `make run-stack` serves), routed like any request for it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clients.errors import ConduitError
from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import REQUEST_ID_METADATA_KEY

from ..errors import APIError, from_engine_error
from ..models import ServedModels

DEFAULT_RETRIEVAL_MODEL = "all-MiniLM-L6-v2"
EMBED_BATCH = 64  # chunks per Embed call: the engine packs them into few forwards
CALL_TIMEOUT_S = 120.0


class Embedder:
    def __init__(self, models: ServedModels, model: str) -> None:
        self.models = models
        self.model = model

    def _engine(self, request_id: str) -> tuple[pb.ModelInfo, object, list[tuple[str, str]]]:
        metadata = [(REQUEST_ID_METADATA_KEY, request_id)]
        try:
            info, engine = self.models.route(self.model, metadata=metadata)
        except APIError as error:
            if error.code != "model_not_found":
                raise
            raise APIError(503, f"Retrieval needs the embedding model '{self.model}' (--retrieval-model), which no "
                           "engine of this server serves.", "server_error", None, "embedding_model_unavailable",
                           {"Retry-After": "5"}) from None
        return info, engine, metadata

    def window(self, request_id: str) -> int:
        """Tokens the model reads at once, its special tokens included."""
        info, _, _ = self._engine(request_id)
        return int(info.max_context_length) or 512

    def tokens(self, text: str, request_id: str) -> Sequence[str]:
        info, engine, metadata = self._engine(request_id)
        try:
            answer = engine.tokenize(request=pb.TokenizeRequest(model=info.id, text=text), timeout=CALL_TIMEOUT_S,
                                     metadata=metadata)
        except ConduitError as error:
            raise from_engine_error(error, request_id) from None
        return list(answer.tokens)

    def embed(self, texts: Sequence[str], request_id: str) -> np.ndarray:
        """Unit vectors, one row per text. A text longer than the window is embedded by its first
        window of tokens (truncate_prompt_tokens 0: to the model's context)."""
        info, engine, metadata = self._engine(request_id)
        rows = []
        for start in range(0, len(texts), EMBED_BATCH):
            request = pb.EmbedRequest(model=info.id, truncate_prompt_tokens=0, request_id=request_id,
                                      inputs=[pb.EmbedInput(text=t) for t in texts[start:start + EMBED_BATCH]])
            try:
                answer = engine.embed(request=request, timeout=CALL_TIMEOUT_S, metadata=metadata)
            except ConduitError as error:
                raise from_engine_error(error, request_id) from None
            rows += [np.asarray(e.values, np.float32) for e in answer.embeddings]
        if not rows:
            return np.zeros((0, 0), np.float32)
        matrix = np.vstack(rows)
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        return matrix / np.where(norms == 0, 1, norms)  # unit rows: a dot product is the cosine
