"""API keys: where they come from and how a request's key is checked.

Keys come from `--api-key`, `--api-key-file` and the environment (`CONDUIT_API_KEYS`, comma-separated;
`CONDUIT_API_KEY`, one key). With any key set, every /v1 route needs `Authorization: Bearer <key>` (or
`x-api-key: <key>`, as Anthropic's clients send it); /health, /metrics, /openapi.json and the playground
stay open (they carry no secrets). Keys follow the rules of the engine's tokens (conduit_common.bearer),
and the check takes the same time whichever key matched.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from conduit_common.bearer import BearerSecrets, collect_secrets

KEYS_ENV = "CONDUIT_API_KEYS"
KEY_ENV = "CONDUIT_API_KEY"  # one key; kept from before several keys were allowed


def collect_keys(
    flags: Iterable[str] = (), files: Iterable[str | Path] = (), environ: Mapping[str, str] | None = None
) -> tuple[str, ...]:
    """Every configured key, deduplicated, in order: flags, files, then the environment.
    Raises SecretError (a ValueError) naming what it refuses."""
    environ = os.environ if environ is None else environ
    from_env = [key for key in environ.get(KEYS_ENV, "").split(",") + [environ.get(KEY_ENV, "")] if key.strip()]
    keys = collect_secrets(flags, files, "API key")
    return tuple(dict.fromkeys(keys + collect_secrets(from_env, (), "API key")))


class KeyChecker:
    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = BearerSecrets(keys)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def check(self, authorization: str | None) -> bool:
        """Whether an Authorization header value is "Bearer <one of the keys>"."""
        return self._keys.authorizes(authorization)

    def check_key(self, key: str | None) -> bool:  # a bare key: Anthropic's `x-api-key` header
        return self._keys.matches(key)
