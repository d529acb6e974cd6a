"""API keys: where they come from (app.py checks each request's key against them).

Keys come from `--api-key`, `--api-key-file` and the environment (`CONDUIT_API_KEYS`, comma-separated;
`CONDUIT_API_KEY`, one key). With any key set, every /v1 route needs `Authorization: Bearer <key>` (or
`x-api-key: <key>`, as Anthropic's clients send it); /health, /metrics, /openapi.json and the playground
stay open (they carry no secrets). Keys follow the rules of the engine's tokens and are compared as they
are (conduit_common.bearer): in the same time whichever key matched.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from flask import g

from conduit_common.bearer import collect_secrets

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



# ------------------------------------------------------------------ tenants

_TENANT_KEY = "conduit_tenant"


def tenant_of(api_key: str) -> str:
    """The tenant a key names: a digest, so no key is ever stored (files, vector stores, responses and
    batches record it as their owner)."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:32]


def set_tenant(api_key: str | None) -> None:
    """Called once the request's key is accepted (app.py); no keys configured: everyone is one tenant."""
    g.conduit_tenant = tenant_of(api_key) if api_key else ""


def set_tenant_digest(owner: str) -> None:
    """For work done later on a tenant's behalf (a batch's requests): the owner recorded, no key needed."""
    g.conduit_tenant = owner


def tenant() -> str:
    """The current request's tenant: '' where the shim has no API keys."""
    return g.get(_TENANT_KEY, "")
