"""Python clients for Conduit: typed gRPC clients for the engine and a local stack launcher."""

from clients.engine_client import AsyncEngineClient, AsyncGenerateStream, EngineClient, GenerateStream, tls_credentials
from clients.errors import (Cancelled, ConduitError, DeadlineExceeded, Internal, InvalidArgument, NotFound,
                            ResourceExhausted, Unauthenticated, Unavailable)
from clients.request_builder import build_request
from conduit_common.results import Choice, Completion, ToolCall, Usage

__all__ = [
    "AsyncEngineClient", "AsyncGenerateStream", "Cancelled", "Choice", "Completion", "ConduitError",
    "DeadlineExceeded", "EngineClient", "GenerateStream", "Internal", "InvalidArgument", "NotFound",
    "ResourceExhausted", "ToolCall", "Unauthenticated", "Unavailable", "Usage", "build_request",
    "tls_credentials",
]
