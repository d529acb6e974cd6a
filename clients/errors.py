"""Exceptions of the Conduit client, one per gRPC status the engine documents.

Callers catch `NotFound` or `ResourceExhausted` instead of inspecting
`grpc.RpcError.code()`; the original error stays reachable as `__cause__`.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc

from conduit.v1.contract import ERROR_CODE_METADATA_KEY, PARAM_METADATA_KEY


class ConduitError(Exception):
    """A failed engine call: the gRPC status code, the server's message and its trailing metadata."""

    def __init__(self, code: grpc.StatusCode, message: str, metadata: Mapping[str, str] | None = None) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.metadata = dict(metadata or {})

    @property
    def param(self) -> str | None:
        """The request field at fault as a GenerateRequest path ("sampling.top_p"), when the engine named it."""
        return self.metadata.get(PARAM_METADATA_KEY) or None

    @property
    def error_code(self) -> str | None:
        """The kind of error when the engine knows it ("context_length_exceeded")."""
        return self.metadata.get(ERROR_CODE_METADATA_KEY) or None


class InvalidArgument(ConduitError):
    """Bad input: empty messages, a prompt over the context, a value out of range."""


class NotFound(ConduitError):
    """Unknown model (or unknown health service name)."""


class ResourceExhausted(ConduitError):
    """The engine's waiting queue is full; retry later."""


class Unavailable(ConduitError):
    """The engine is starting, shutting down or unreachable."""


class DeadlineExceeded(ConduitError):
    """The call's deadline passed; the engine stopped generating."""


class Cancelled(ConduitError):
    """The call was cancelled; the engine stopped generating."""


class Unauthenticated(ConduitError):
    """The engine requires a token (or a client certificate) and the call had none that it accepts."""


class Internal(ConduitError):
    """The engine failed while serving the call; the message names the request id its log uses."""


_BY_CODE: dict[grpc.StatusCode, type[ConduitError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.INTERNAL: Internal,
}


def from_status(code: grpc.StatusCode, message: str, metadata: Mapping[str, str] | None = None) -> ConduitError:
    """The ConduitError subclass for a status code."""
    return _BY_CODE.get(code, ConduitError)(code, message, metadata)


def from_rpc_error(error: grpc.RpcError) -> ConduitError:
    """The ConduitError subclass for a failed call's status code."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return from_status(code, details or "", _trailing_metadata(error))


def _trailing_metadata(error: grpc.RpcError) -> dict[str, str]:
    """The call's text trailing metadata; empty when it failed before having any."""
    getter = getattr(error, "trailing_metadata", None)
    try:
        items = getter() if callable(getter) else None
    except Exception:  # an error raised before the call had trailers
        items = None
    return {key.lower(): value for key, value in items or () if isinstance(value, str)}
