"""The embedding model's engine, as retrieval uses it: its window, a text's token strings (for
chunking) and vectors (for chunks and queries). The model is `--retrieval-model`, routed like any
request for it; `auto` (the default) takes all-MiniLM-L6-v2 when it is served (what `make run-stack`
starts), else the first served model whose engine embeds (so `EMBEDDING_MODEL=/a/folder` works too)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clients.errors import ConduitError
from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import REQUEST_ID_METADATA_KEY

from ..errors import APIError, from_engine_error
from ..models import ServedModels

DEFAULT_RETRIEVAL_MODEL = "auto"
PREFERRED_MODEL = "all-MiniLM-L6-v2"
EMBED_BATCH = 64  # chunks per Embed call: the engine packs them into few forwards
CALL_TIMEOUT_S = 120.0


class Embedder:
    def __init__(self, models: ServedModels, model: str) -> None:
        self.models = models
        self.model = model
        self._chosen: str | None = None if model == DEFAULT_RETRIEVAL_MODEL else model

    def _choose(self, metadata: list[tuple[str, str]]) -> str:
        """`auto`: the preferred model if served, else the first whose engine answers Embed (a chat
        engine refuses it); kept once found."""
        if self._chosen is not None:
            return self._chosen
        served = [m.id for m in self.models.list(metadata=metadata)]
        for name in sorted(served, key=lambda n: n != PREFERRED_MODEL):
            try:
                _, engine = self.models.route(name, metadata=metadata)
                engine.embed(request=pb.EmbedRequest(model=name, inputs=[pb.EmbedInput(text="probe")]),
                             timeout=CALL_TIMEOUT_S, metadata=metadata)
            except (ConduitError, APIError):
                continue
            self._chosen = name
            return name
        return PREFERRED_MODEL  # none embeds: the 503 below names the model expected

    def _engine(self, request_id: str) -> tuple[pb.ModelInfo, object, list[tuple[str, str]]]:
        metadata = [(REQUEST_ID_METADATA_KEY, request_id)]
        model = self._choose(metadata)
        try:
            info, engine = self.models.route(model, metadata=metadata)
        except APIError as error:
            if error.code != "model_not_found":
                raise
            raise APIError(503, f"Retrieval needs an embedding model ('{model}', --retrieval-model), which no "
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
