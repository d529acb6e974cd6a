"""An MCP server as a request names it once allowed, and how an operation on it failed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .allowlist import UrlPrefix


@dataclass(frozen=True)
class McpServer:
    """A server the request names, once allowed: `prefix` is the allowlist entry all its requests keep to."""

    label: str
    url: str
    prefix: UrlPrefix
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # secrets: never in a repr or a log


class McpFailure(Exception):
    """An operation that failed: `error` in OpenAI's shape, `outcome` for the metrics."""

    def __init__(self, outcome: str, error: dict[str, Any]) -> None:
        super().__init__(error.get("message") or outcome)
        self.outcome = outcome
        self.error = error

    @property
    def message(self) -> str:
        return str(self)


def http_failure(outcome: str, code: int, message: str) -> McpFailure:
    return McpFailure(outcome, {"type": "http_error", "code": code, "message": message})
