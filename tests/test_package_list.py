"""pyproject.toml lists its packages by hand (protos/conduit installs as `conduit`), so a new package
folder must be added there too: an installed `conduit-shim` once failed with `No module named
'http_shim.openai'` while every test from the source tree passed. This keeps the list and the folders equal."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOT_INSTALLED = {"tests", "benchmarks", "build"}  # run from a checkout only; build/: a wheel build's copy


def package_folders() -> set[str]:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    renamed = {folder: name for name, folder in setuptools["package-dir"].items()}
    found = set()
    tops = [d for d in ROOT.iterdir() if d.is_dir() and d.name not in NOT_INSTALLED and not d.name.startswith(".")]
    for init in (init for top in tops for init in top.rglob("__init__.py")):
        folder = init.parent.relative_to(ROOT)
        top = next((f for f in renamed if folder.as_posix().startswith(f)), None)
        dotted = folder.as_posix()
        if top is not None:
            dotted = renamed[top] + dotted[len(top):]
        found.add(dotted.replace("/", "."))
    return found


def test_every_package_folder_is_installed() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert package_folders() == listed
