"""The conduit.v1 facts that the generated code does not carry, written once.

engine.proto documents each of them in its comments; this module is their one Python
implementation, imported by the engine, the HTTP shim and the clients alike. It needs
only protobuf (no grpc, no torch), so every process can import it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from conduit.v1 import engine_pb2 as pb

# ------------------------------------------------------------------ the service

# The name the engine registers with grpc.health.v1.Health (beside "", the whole server).
ENGINE_SERVICE: str = pb.DESCRIPTOR.services_by_name["Engine"].full_name

# Long prompts sent as token ids and echoed prompt logprobs outgrow gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Channel (and server) options that allow MAX_MESSAGE_BYTES both ways.
MESSAGE_SIZE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)

# Keepalive: a client pings the engine every KEEPALIVE_TIME_S, and a ping unanswered within
# KEEPALIVE_TIMEOUT_S ends the connection and fails every call on it UNAVAILABLE. An engine host
# gone without a reset (powered off, route dropped) or a process stopped with SIGSTOP (its kernel
# still ACKs TCP, but nothing answers HTTP/2 PINGs) is then noticed within about
# KEEPALIVE_TIME_S + KEEPALIVE_TIMEOUT_S of its last message (the ping timer restarts at each): 10 s.
KEEPALIVE_TIME_S = 5.0
KEEPALIVE_TIMEOUT_S = 5.0
# The engine accepts pings this often (also between calls): clients pinging less often are never
# answered GOAWAY too_many_pings (gRPC servers refuse pings more often than every 5 min by default).
MIN_PING_INTERVAL_S = 1.0


def keepalive_options(time_s: float = KEEPALIVE_TIME_S,
                      timeout_s: float = KEEPALIVE_TIMEOUT_S) -> tuple[tuple[str, int], ...]:
    """A client channel's keepalive options: a ping every `time_s` (at least MIN_PING_INTERVAL_S,
    which the engine allows), also with no call open, and no cap on pings sent without data."""
    if time_s < MIN_PING_INTERVAL_S or timeout_s <= 0:
        raise ValueError(f"keepalive pings every >= {MIN_PING_INTERVAL_S:g} s, with a timeout > 0")
    return (
        ("grpc.keepalive_time_ms", int(time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(timeout_s * 1000)),
        # Any ping's: a keepalive ping waits on a flow-control (BDP) ping already out, whose
        # timeout would otherwise be a minute.
        ("grpc.http2.ping_timeout_ms", int(timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    )


# The engine server's side: pings as often as MIN_PING_INTERVAL_S are allowed, with or without
# calls (half that is enforced: a client's timer may fire a little early).
SERVER_KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.http2.min_ping_interval_without_data_ms", int(MIN_PING_INTERVAL_S * 1000 / 2)),
    ("grpc.keepalive_permit_without_calls", 1),
)

# Trailing metadata of an INVALID_ARGUMENT error: the field at fault, as a path in
# GenerateRequest ("sampling.top_p"), and the kind of error when known ("context_length_exceeded").
PARAM_METADATA_KEY = "conduit-param"
ERROR_CODE_METADATA_KEY = "conduit-error-code"

# ------------------------------------------------------------------ call metadata and security

# Request metadata naming the request in the engine's logs (and its INTERNAL error messages);
# without it the engine uses GenerateRequest.request_id, or an id of its own.
REQUEST_ID_METADATA_KEY = "x-request-id"
# Request metadata carrying "Bearer <token>" when the engine requires a token.
AUTHORIZATION_METADATA_KEY = "authorization"
# Services an engine with a token still serves without one: probes (Kubernetes' gRPC probe
# cannot send metadata) and the schema, which is this public contract anyway.
OPEN_SERVICES: tuple[str, ...] = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
)
# Environment variables: the engine's accepted tokens (comma-separated), and the one token a
# client (the HTTP shim, the launcher) sends.
ENGINE_TOKENS_ENV = "CONDUIT_ENGINE_TOKENS"
ENGINE_TOKEN_ENV = "CONDUIT_ENGINE_TOKEN"

# ------------------------------------------------------------------ request limits


@dataclass(frozen=True)
class Range:
    """An interval of allowed values: closed, or open at the low end when `lo_open`."""

    lo: float
    hi: float
    lo_open: bool = False

    def __contains__(self, value: float) -> bool:
        return (self.lo < value if self.lo_open else self.lo <= value) and value <= self.hi

    def __str__(self) -> str:
        return f"{'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}]"


# SamplingParams fields with a bounded range, by field name.
SAMPLING_RANGES: dict[str, Range] = {
    "temperature": Range(0.0, 2.0),
    "top_p": Range(0.0, 1.0, lo_open=True),
    "min_p": Range(0.0, 1.0),
    "repetition_penalty": Range(0.0, 2.0, lo_open=True),
    "presence_penalty": Range(-2.0, 2.0),
    "frequency_penalty": Range(-2.0, 2.0),
}
LOGIT_BIAS_RANGE = Range(-100.0, 100.0)
MAX_N = 16  # GenerateRequest.n is in [1, MAX_N]
MAX_TOP_LOGPROBS = 20  # GenerateRequest.top_logprobs is in [0, MAX_TOP_LOGPROBS]
MAX_STOP_STRINGS = 16  # StoppingParams.stop holds at most this many
MAX_EMBED_INPUTS = 2048  # EmbedRequest.inputs holds 1 to this many (OpenAI's limit too)
# ChatInput.reasoning_effort's values (besides empty: the template's default).
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")

# ------------------------------------------------------------------ responses

# FinishReason values by the names OpenAI (and the engine) use for them.
FINISH_REASONS: dict[str, int] = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "tool_calls": pb.FINISH_REASON_TOOL_CALLS,
}
_FINISH_REASON_NAMES = {value: name for name, value in FINISH_REASONS.items()}


def finish_reason_name(value: int) -> str | None:
    """"stop", "length" or "tool_calls"; None for FINISH_REASON_UNSPECIFIED."""
    return _FINISH_REASON_NAMES.get(value)


def new_tool_call_id() -> str:
    """An OpenAI-style tool call id, e.g. "call_3f2a...", unique per call."""
    return f"call_{uuid.uuid4().hex[:24]}"
