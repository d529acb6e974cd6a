"""The shim's import graph, read from the source (every import, at the top or inside a function): no circle
among http_shim's modules, and no API package reaching into another API's code (what they share lives in
protocol/); of another API an API may import only its typed requests (embeddings reads OpenAI's chat
messages)."""

from __future__ import annotations

import ast
from pathlib import Path

SHIM = Path(__file__).resolve().parent.parent / "http_shim"
API_PACKAGES = ("http_shim.openai", "http_shim.responses", "http_shim.messages", "http_shim.embeddings")


def shim_modules() -> dict[str, Path]:
    """http_shim's modules by dotted name (a package by its own name, for its __init__.py)."""
    modules = {}
    for path in SHIM.rglob("*.py"):
        parts = path.relative_to(SHIM.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def named_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The http_shim modules `path`'s import statements name: `import X`, `from X import y` (X, and X.y when
    that is a module), relative ones resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            named |= {source} | {f"{source}.{alias.name}" for alias in node.names}
    return {module for module in named if module in modules and module != name}


def import_graph() -> dict[str, set[str]]:
    """Module -> the http_shim modules importing it runs: those it names, and their packages' __init__s
    (a package of its own is already under way when it runs, so that is no edge)."""
    modules = shim_modules()
    graph = {}
    for name, path in modules.items():
        own = {name.rsplit(".", depth)[0] for depth in range(1, name.count(".") + 1)}
        runs = set()
        for module in named_imports(name, path, modules):
            parts = module.split(".")
            runs |= {".".join(parts[:end]) for end in range(2, len(parts) + 1)} - own
        graph[name] = runs - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_reader_sees_relative_and_function_level_imports():
    graph = import_graph()
    assert "http_shim.protocol.base" in graph["http_shim.openai.protocol"]  # from ..protocol.base import ...
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_among_the_shims_modules():
    assert circles(import_graph()) == []


def test_an_api_package_imports_of_another_api_only_its_typed_requests():
    modules = shim_modules()
    reaching = {}
    for name, path in modules.items():
        api = next((p for p in API_PACKAGES if name == p or name.startswith(p + ".")), None)
        if api is None:
            continue
        others = {m for m in named_imports(name, path, modules)
                  if any(m == p or m.startswith(p + ".") for p in API_PACKAGES if p != api)}
        if others - {f"{p}.protocol" for p in API_PACKAGES}:
            reaching[name] = sorted(others - {f"{p}.protocol" for p in API_PACKAGES})
    assert reaching == {}
