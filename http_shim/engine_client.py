"""The shim's one gRPC channel to the engine, and a cached view of the models it serves."""

from __future__ import annotations

import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conduit.v1 import engine_pb2 as pb
from conduit.v1 import engine_pb2_grpc

from .errors import from_grpc, model_not_found

HEALTH_SERVICE = "conduit.v1.Engine"
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # long prompts as token ids, echoed prompt logprobs


class EngineClient:
    """Wraps the stubs; turns failures of the small unary calls into APIErrors."""

    def __init__(self, target: str, rpc_timeout_s: float = 10.0, models_ttl_s: float = 30.0) -> None:
        options = [
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
        ]
        self.target = target
        self._channel = grpc.insecure_channel(target, options=options)
        self._stub = engine_pb2_grpc.EngineStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._rpc_timeout_s = rpc_timeout_s
        self._models_ttl_s = models_ttl_s
        self._models: list[pb.ModelInfo] = []
        self._models_at = float("-inf")
        self._lock = threading.Lock()

    def close(self) -> None:
        self._channel.close()

    def health(self) -> str:
        """The engine's health status name (SERVING, NOT_SERVING, ...) or UNREACHABLE."""
        try:
            reply = self._health.Check(
                health_pb2.HealthCheckRequest(service=HEALTH_SERVICE), timeout=min(self._rpc_timeout_s, 2.0)
            )
        except grpc.RpcError:
            return "UNREACHABLE"
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def list_models(self, max_age_s: float | None = None) -> list[pb.ModelInfo]:
        """Served models, cached: every request names a model and the list rarely changes."""
        max_age_s = self._models_ttl_s if max_age_s is None else max_age_s
        with self._lock:
            if time.monotonic() - self._models_at <= max_age_s:
                return self._models
        try:
            models = list(self._stub.ListModels(pb.ListModelsRequest(), timeout=self._rpc_timeout_s).models)
        except grpc.RpcError as error:
            raise from_grpc(error) from None
        with self._lock:
            self._models, self._models_at = models, time.monotonic()
        return models

    def resolve_model(self, name: str) -> pb.ModelInfo:
        """The served model called `name`; a miss refreshes the cache once (the engine may have restarted)."""
        for max_age_s in (None, 1.0):
            for model in self.list_models(max_age_s):
                if model.id == name:
                    return model
        raise model_not_found(name)

    def model_info(self, name: str) -> pb.ModelInfo:
        try:
            return self._stub.GetModelInfo(pb.GetModelInfoRequest(model=name), timeout=self._rpc_timeout_s)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                raise model_not_found(name) from None
            raise from_grpc(error) from None

    def generate(self, request: pb.GenerateRequest, timeout_s: float | None) -> grpc.Call:
        """Starts a Generate stream; the caller iterates it and must cancel() it when done or abandoned."""
        return self._stub.Generate(request, timeout=timeout_s)
