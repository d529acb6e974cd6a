"""Bearer secrets, the engine's tokens and the shim's API keys alike: read, checked and compared here,
by one set of rules.

A secret comes from a flag (or its environment variable) or from a file, one a line, blank lines and
lines starting with `#` skipped. A secret may not be empty nor hold whitespace (it could never be
sent as `Bearer <secret>`), and a file that holds none, or cannot be read, stops the process at start:
an operator who named a file meant to require a secret, and a process that ran open instead would
say so only in a log line. Checks compare SHA-256 digests with `hmac.compare_digest` against every
secret without stopping at a match: the time taken tells neither how much of a guess was right nor
which secret matched.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from pathlib import Path


class SecretError(ValueError):
    """A secret, or a file of them, that the process refuses to start with."""


def read_secret_file(path: str | Path, what: str) -> list[str]:
    """The secrets of a file (`what`: "token", "API key", for the messages), one a line."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise SecretError(f"cannot read the {what} file {path}: {error}") from None
    found = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if line and not line.startswith("#"):
            found.append(_checked(line, what, f"the {what} file {path}, line {number}"))
    if not found:
        raise SecretError(f"the {what} file {path} holds no {what} (only blank lines and # comments): "
                          f"refusing to start without authentication")
    return found


def collect_secrets(values: Iterable[str], files: Iterable[str | Path], what: str) -> tuple[str, ...]:
    """Every secret given (flags and variables, then files), checked, deduplicated, in order.
    Raises SecretError."""
    found = [_checked(value.strip(), what, f"a {what} given by a flag or a variable") for value in values]
    for path in files:
        found += read_secret_file(path, what)
    return tuple(dict.fromkeys(found))


def _checked(secret: str, what: str, where: str) -> str:
    if not secret:
        raise SecretError(f"{where} is empty: an empty {what} is not allowed")
    if any(c.isspace() for c in secret):
        raise SecretError(f"{where} holds whitespace: a {what} may not contain whitespace")
    return secret


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


class BearerSecrets:
    """The accepted secrets, as digests (never the secrets themselves in a repr or a log)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self._digests = [_digest(secret) for secret in secrets]

    def __bool__(self) -> bool:
        return bool(self._digests)

    def __repr__(self) -> str:
        return f"BearerSecrets({len(self._digests)} secret(s))"

    def matches(self, given: str | None) -> bool:
        """Whether `given` is one of the secrets; compared with all of them, every time."""
        digest = _digest(given or "")
        matched = False
        for expected in self._digests:
            matched |= hmac.compare_digest(digest, expected)
        return matched and bool(given)

    def authorizes(self, authorization: str | None) -> bool:
        """Whether an authorization value is `Bearer <one of the secrets>` (the scheme in any case)."""
        scheme, _, given = (authorization or "").strip().partition(" ")
        return self.matches(given.strip()) and scheme.lower() == "bearer"
