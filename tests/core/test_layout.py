"""The shape of the tree that issue #36 asked for, checked on every run: the packages' import graph has no
circle, the two backends never import each other, the core imports neither at module level, and no library
function grows past 80 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"flashspec": ROOT / "shared" / "flashspec", "flashspec_torch": ROOT / "flashspec_torch",
            "flashspec_jax": ROOT / "flashspec_jax"}
LONGEST = 80


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            found[name] = path
    return found


def imported(name: str, path: Path, top_level_only: bool) -> set[str]:
    """The modules of our packages that ``name`` imports (anywhere in the file, or at module level only)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def graph(top_level_only: bool = False) -> dict[str, set[str]]:
    mods = modules()
    return {name: {m for m in imported(name, path, top_level_only) if m in mods and m != name}
            for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def package_of(module: str) -> str:
    return module.split(".")[0]


def test_no_import_circle():
    """Every import inside a package counts, also one inside a function (a lazy import hides a circle, it does
    not break it); across packages, module-level imports count: the core's lazy dispatch to a backend by name
    (``flashspec.engine.engine_class``) is the one sanctioned way down. The edge into a package's own
    ``__init__`` (which re-exports its modules) is not a dependency."""
    anywhere, top = graph(), graph(top_level_only=True)
    edges = {name: {m for m in anywhere[name] | top[name]
                    if (package_of(m) == package_of(name) and m != package_of(name)) or m in top[name]
                    and package_of(m) != package_of(name)}
             for name in anywhere}
    assert find_cycle(edges) is None, f"import circle: {' -> '.join(find_cycle(edges))}"


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("backend,other", [("flashspec_torch", "flashspec_jax"), ("flashspec_jax", "flashspec_torch")])
def test_backends_do_not_know_each_other(backend, other):
    wrong = sorted(f"{name} imports {m}" for name, deps in graph().items() if package_of(name) == backend
                   for m in deps if package_of(m) == other)
    assert not wrong, wrong


def test_core_imports_no_backend_at_module_level():
    wrong = sorted(f"{name} imports {m}" for name, deps in graph(top_level_only=True).items()
                   if package_of(name) == "flashspec" for m in deps if package_of(m) != "flashspec")
    assert not wrong, wrong


def test_no_library_function_past_80_lines():
    long = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= LONGEST:
                long.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not long, long
