"""API keys: where they come from and how a request's key is checked.

Keys come from `--api-key` (repeatable), `--api-key-file` (one key per line; blank lines and
lines starting with # are ignored) and the environment (`CONDUIT_API_KEYS`, comma-separated;
`CONDUIT_API_KEY`, one key). With any key configured, every /v1 route needs
`Authorization: Bearer <key>` (or `x-api-key: <key>`, as Anthropic's clients send it); /health, /metrics and /openapi.json stay open (probes, scrapers
and the schema carry no secrets).

The check compares SHA-256 digests with `hmac.compare_digest` against every key, without
stopping at a match: its time depends neither on how much of a key a guess got right nor on
which key matched.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

KEYS_ENV = "CONDUIT_API_KEYS"
KEY_ENV = "CONDUIT_API_KEY"  # one key; kept from before several keys were allowed


class KeyFileError(ValueError):
    """A key file that cannot be read or holds no key (the shim refuses to start open by mistake)."""


def read_key_file(path: str | Path) -> list[str]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise KeyFileError(f"cannot read API key file {path}: {error}") from None
    keys = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if not keys:
        raise KeyFileError(f"API key file {path} holds no key")
    return keys


def collect_keys(
    flags: Iterable[str] = (), files: Iterable[str | Path] = (), environ: Mapping[str, str] | None = None
) -> tuple[str, ...]:
    """Every configured key, deduplicated, in order: flags, files, then the environment."""
    environ = os.environ if environ is None else environ
    keys = list(flags)
    for path in files:
        keys.extend(read_key_file(path))
    keys.extend(environ.get(KEYS_ENV, "").split(","))
    keys.append(environ.get(KEY_ENV, ""))
    return tuple(dict.fromkeys(k.strip() for k in keys if k.strip()))


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


class KeyChecker:
    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = [_digest(k) for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def check(self, authorization: str | None) -> bool:
        """Whether an Authorization header value is "Bearer <one of the keys>"."""
        scheme, _, given = (authorization or "").strip().partition(" ")
        digest = _digest(given.strip())
        matched = False
        for expected in self._digests:
            matched |= hmac.compare_digest(digest, expected)
        return matched and scheme.lower() == "bearer"

    def check_key(self, key: str | None) -> bool:
        """Whether a bare key (Anthropic's `x-api-key` header) is one of the keys."""
        return key is not None and self.check(f"Bearer {key}")
