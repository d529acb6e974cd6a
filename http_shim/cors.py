"""CORS: which web pages on other origins may call the API from a browser (none unless allowed).

With `--cors-allow-origin` set, a preflight from an allowed origin is answered before API keys are
checked (browsers send no credentials in one), and every answer to it carries the CORS headers. `*`
allows every origin but never with credentials (the Fetch standard forbids it); a listed origin is
echoed back. Origins are compared as browsers send them: lower-case scheme and host, no default port.
"""

from __future__ import annotations

from dataclasses import dataclass

from flask import Flask, Response, request

ALLOWED_METHODS = ("GET", "POST", "DELETE", "OPTIONS")
# What pages send: our own, the openai and anthropic SDKs' (the JS ones also send X-Stainless-*).
ALLOWED_HEADERS = (
    "Authorization", "Content-Type", "Accept", "X-Request-Id",
    "OpenAI-Organization", "OpenAI-Project", "OpenAI-Beta", "Idempotency-Key",
    "X-Api-Key", "Anthropic-Version", "Anthropic-Beta", "Anthropic-Dangerous-Direct-Browser-Access",
    "X-Stainless-Lang", "X-Stainless-Package-Version", "X-Stainless-OS", "X-Stainless-Arch",
    "X-Stainless-Runtime", "X-Stainless-Runtime-Version", "X-Stainless-Retry-Count", "X-Stainless-Timeout",
)
# The SDKs' header family: new members are allowed when a preflight asks for them.
_ALLOWED_PREFIX = "x-stainless-"
# What a page may read from an answer besides the CORS-safelisted headers.
EXPOSED_HEADERS = ("X-Request-Id", "Retry-After")
PREFLIGHT_MAX_AGE_S = 600


@dataclass(frozen=True)
class CorsPolicy:
    origins: tuple[str, ...] = ()  # as browsers write them (see normal_origin), or "*"; none: CORS off

    def allow_origin(self, origin: str | None) -> str | None:
        """The Access-Control-Allow-Origin value for a request from `origin`, or None when refused."""
        if not origin:
            return None
        if origin in self.origins:
            return origin
        return "*" if "*" in self.origins else None

    def headers(self, origin: str) -> dict[str, str]:
        """What every answer to an allowed `origin` carries."""
        allowed = self.allow_origin(origin)
        headers = {"Access-Control-Allow-Origin": allowed, "Access-Control-Expose-Headers": ", ".join(EXPOSED_HEADERS)}
        if allowed != "*":
            headers["Access-Control-Allow-Credentials"] = "true"
        return headers

    def preflight_headers(self, origin: str, requested: str) -> dict[str, str]:
        wanted = [name.strip() for name in requested.split(",") if name.strip()]
        extra = [name for name in wanted if name.lower().startswith(_ALLOWED_PREFIX)
                 and name.lower() not in {h.lower() for h in ALLOWED_HEADERS}]
        return {**self.headers(origin), "Access-Control-Allow-Methods": ", ".join(ALLOWED_METHODS),
                "Access-Control-Allow-Headers": ", ".join(ALLOWED_HEADERS + tuple(extra)),
                "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S), "Vary": "Origin, Access-Control-Request-Headers"}


def normal_origin(origin: str) -> str:
    """An origin as a browser's Origin header writes it: "HTTP://Example.COM:80" -> "http://example.com"."""
    if origin == "*":
        return origin
    scheme, _, host = origin.lower().partition("://")
    default = {"http": ":80", "https": ":443"}.get(scheme)
    return f"{scheme}://{host.removesuffix(default) if default else host}"


def install_cors(app: Flask, policy: CorsPolicy) -> None:
    """Registers the preflight answer (first among the app's before_request hooks: call this before
    the others are registered) and the headers on every answer."""
    if not policy.origins:
        return

    @app.before_request
    def answer_preflight() -> Response | None:
        if request.method != "OPTIONS" or "Access-Control-Request-Method" not in request.headers:
            return None
        origin = request.headers.get("Origin")
        if policy.allow_origin(origin) is None:
            return Response(status=204)  # no Allow-Origin: the browser refuses the page's request
        return Response(status=204, headers=policy.preflight_headers(
            origin, request.headers.get("Access-Control-Request-Headers", "")))

    @app.after_request
    def add_cors_headers(response: Response) -> Response:
        origin = request.headers.get("Origin")
        if origin and policy.origins != ("*",):
            response.vary.add("Origin")  # the answer depends on the origin: caches keep them apart
        if policy.allow_origin(origin) is not None and "Access-Control-Allow-Origin" not in response.headers:
            response.headers.update(policy.headers(origin))
        return response
