"""Who may call the engine: bearer tokens (a server interceptor), TLS and mutual TLS.

Tokens come from `--auth-token` (repeatable), `--auth-token-file` (one per line; blank lines and
`#` comments skipped) and the CONDUIT_ENGINE_TOKENS environment variable (comma-separated), read and
checked by the rules the shim's API keys follow (conduit_common.bearer): a file without a token
stops the engine at start rather than leave it open. With any token configured, every call must
carry the metadata `authorization: Bearer <token>` for one of them, or it ends with UNAUTHENTICATED
before reaching the engine. The health service and reflection stay open (contract.OPEN_SERVICES):
Kubernetes' gRPC probes send no metadata, and the schema is the public contract. Tokens travel in
clear text unless TLS is on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from conduit_common.bearer import BearerSecrets, collect_secrets
from conduit.v1.contract import AUTHORIZATION_METADATA_KEY, OPEN_SERVICES

DENIED_MESSAGE = "missing or invalid token: send the metadata 'authorization: Bearer <token>'"


def collect_tokens(tokens: Iterable[str] = (), token_file: str | Path | None = None) -> list[str]:
    """All accepted tokens: the flags' (and $CONDUIT_ENGINE_TOKENS', which the parser reads into
    them), then the file's. Raises SecretError (a ValueError) naming what it refuses."""
    return list(collect_secrets(tokens, [token_file] if token_file else [], "token"))


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for calls without `authorization: Bearer <one of the tokens>`, except to
    OPEN_SERVICES. Tokens are compared in constant time, all of them every time."""

    def __init__(self, tokens: Sequence[str]) -> None:
        if not tokens:
            raise ValueError("TokenAuthInterceptor needs at least one token")
        self._tokens = BearerSecrets(tokens)

    def authorized(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
        given = next((value for key, value in metadata or () if key == AUTHORIZATION_METADATA_KEY), None)
        return isinstance(given, str) and self._tokens.authorizes(given)

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        service = details.method.lstrip("/").rpartition("/")[0]
        handler = await continuation(details)
        if handler is None or service in OPEN_SERVICES or self.authorized(details.invocation_metadata):
            return handler
        return _denying(handler)


def _denying(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that ends the call with UNAUTHENTICATED."""

    async def deny(_request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, DENIED_MESSAGE)

    codecs = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(deny, **codecs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(deny, **codecs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(deny, **codecs)
    return grpc.stream_stream_rpc_method_handler(deny, **codecs)


@dataclass
class ServerSecurity:
    """What the engine's port requires: tokens, and TLS (with client certificates when
    `client_ca_file` is set: mutual TLS)."""

    tokens: list[str] = field(default_factory=list, repr=False)  # never in logs or reprs
    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("TLS needs both a certificate (--tls-cert) and its key (--tls-key)")
        if self.client_ca_file and not self.cert_file:
            raise ValueError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")

    @property
    def tls(self) -> bool:
        return bool(self.cert_file)

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        return [TokenAuthInterceptor(self.tokens)] if self.tokens else []

    def credentials(self) -> grpc.ServerCredentials | None:
        """TLS server credentials (reading the files now), or None for plaintext."""
        if not self.tls:
            return None
        chain = Path(self.cert_file).read_bytes()  # type: ignore[arg-type]
        key = Path(self.key_file).read_bytes()  # type: ignore[arg-type]
        client_ca = Path(self.client_ca_file).read_bytes() if self.client_ca_file else None
        return grpc.ssl_server_credentials([(key, chain)], root_certificates=client_ca,
                                           require_client_auth=client_ca is not None)

    def describe(self) -> str:
        """For the startup log line; never the tokens themselves."""
        tls = "mutual TLS" if self.client_ca_file else "TLS" if self.tls else "plaintext"
        auth = f"{len(self.tokens)} token(s) required" if self.tokens else "no token required"
        return f"{tls}, {auth}"
