"""The models the engine serves, as the shim sees them: every request names one, so the list is cached."""

from __future__ import annotations

import threading
import time

from clients.engine_client import EngineClient, Metadata
from clients.errors import NotFound
from conduit.v1 import engine_pb2 as pb

from .errors import model_not_found

# Deadline of the small unary calls (ListModels, GetModelInfo).
RPC_TIMEOUT_S = 10.0
# How long the model list is trusted; the engine rarely changes what it serves.
MODELS_TTL_S = 30.0


class ServedModels:
    """Failed engine calls raise the client's ConduitError; an unknown model raises a 404 APIError."""

    def __init__(self, engine: EngineClient) -> None:
        self._engine = engine
        self._models: list[pb.ModelInfo] = []
        self._models_at = float("-inf")
        self._lock = threading.Lock()

    def list(self, max_age_s: float = MODELS_TTL_S, metadata: Metadata = ()) -> list[pb.ModelInfo]:
        with self._lock:
            if time.monotonic() - self._models_at <= max_age_s:
                return self._models
        models = self._engine.list_models(timeout=RPC_TIMEOUT_S, metadata=metadata)
        with self._lock:
            self._models, self._models_at = models, time.monotonic()
        return models

    def resolve(self, name: str, metadata: Metadata = ()) -> pb.ModelInfo:
        """The served model called `name`; a miss refreshes the cache once (the engine may have restarted)."""
        for max_age_s in (MODELS_TTL_S, 1.0):
            for model in self.list(max_age_s, metadata):
                if model.id == name:
                    return model
        raise model_not_found(name)

    def info(self, name: str, metadata: Metadata = ()) -> pb.ModelInfo:
        """GetModelInfo, uncached."""
        try:
            return self._engine.model_info(name, timeout=RPC_TIMEOUT_S, metadata=metadata)
        except NotFound:
            raise model_not_found(name) from None
