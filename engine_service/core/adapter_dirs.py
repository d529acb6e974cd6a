"""Where LoRA adapters may be loaded from at run time (LoadAdapter, the shim's /v1/load_lora_adapter): only
from under the folders the operator named (`--lora-dirs`), symlinks resolved, so a caller with the API key
cannot make the engine read an arbitrary file of its host. The engine checks it (it owns the filesystem);
a path is judged by where it really leads, and so are the two files read from it.
"""

from __future__ import annotations

import os
from pathlib import Path

from engine_service.model.lora import CONFIG_FILE, WEIGHTS_FILE, AdapterError


class PathNotAllowed(AdapterError):
    """The path leads outside --lora-dirs (PERMISSION_DENIED)."""


class AdapterNotFound(AdapterError):
    """Nothing at the path (NOT_FOUND, as vLLM's "No adapter found")."""


def allowed_folder(path: str, lora_dirs: tuple[str, ...]) -> Path:
    """The adapter folder `path` leads to (symlinks resolved), when it lies under one of `lora_dirs`;
    raises PathNotAllowed, AdapterNotFound or AdapterError, naming the problem."""
    if not path:
        raise AdapterError("lora_path is empty: give the adapter's folder")
    if not os.path.isabs(path):
        raise PathNotAllowed(f"lora_path {path!r} is not an absolute path; give the adapter's folder under "
                             f"--lora-dirs ({', '.join(lora_dirs)})")
    roots = [Path(os.path.realpath(folder)) for folder in lora_dirs]

    def inside(real: Path) -> bool:
        return any(real == root or root in real.parents for root in roots)

    real = Path(os.path.realpath(path))
    if not inside(real):  # judged before existence: what lies outside is not the caller's to probe
        via = f" (a symlink to {real})" if real != Path(os.path.normpath(path)) else ""
        raise PathNotAllowed(f"lora_path {path}{via} is outside the folders adapters may be loaded from "
                             f"(--lora-dirs: {', '.join(lora_dirs) or 'none'})")
    if not real.exists():
        raise AdapterNotFound(f"No adapter found at {path}")
    if not real.is_dir():
        raise AdapterError(f"lora_path {path} is a file, not an adapter: a PEFT LoRA adapter is a folder with "
                           f"{CONFIG_FILE} and {WEIGHTS_FILE}")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        file = real / name
        if file.exists() and not inside(Path(os.path.realpath(file))):
            raise PathNotAllowed(f"{path}/{name} is a symlink out of --lora-dirs ({', '.join(lora_dirs)})")
    return real
