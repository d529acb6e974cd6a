"""Object ids: a prefix and 128 random bits (uuid4), so ids are unguessable (a file's, a store's, a
response's id is no key to another tenant's objects, but it must not be a guessable one either)."""

from __future__ import annotations

import uuid


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"
