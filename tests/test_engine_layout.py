"""The engine's package boundaries, read from the source: the model package (loading, the runner,
kernels) takes plain step inputs and imports nothing from the engine core, so core -> model is the
only direction (no import circle)."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parent.parent / "engine_service"


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function or TYPE_CHECKING block."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_the_model_package_imports_nothing_from_the_engine_core():
    offenders = {path.name: sorted(name for name in imported_modules(path) if name.startswith("engine_service.core"))
                 for path in sorted((ENGINE / "model").glob("*.py"))}
    assert {name: found for name, found in offenders.items() if found} == {}
