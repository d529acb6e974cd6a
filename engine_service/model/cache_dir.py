"""Where the engine keeps what it builds once: converted GGUF models and the native kernels' builds."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$CONDUIT_CACHE_DIR, else ~/.cache/conduit. Its own module: `make kernels` (model/native.py)
    needs it without the loader's imports."""
    return Path(os.environ.get("CONDUIT_CACHE_DIR") or Path.home() / ".cache" / "conduit")
