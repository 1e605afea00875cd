"""The package layout's rules, read from the source: imports go down, no circles, no private names
across packages, the engine's host side imports no jax, and the kernels never import jaxinfer."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "jaxinfer"
# A package may import its own modules and those of packages ranked below it.
RANK = {
    "kernels": 0, "config": 0, "parallel": 1, "quantization": 2, "cache": 3, "sampling": 3, "models": 4,
    "checkpoint": 5, "speculative": 6, "runtime": 7, "engine": 8, "entrypoints": 9,
}
ACCELERATOR_LIBRARIES = ("jax", "jaxlib", "pallas_kernels")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_only(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imports(tree: ast.AST, top_level_only: bool) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) of each import; TYPE_CHECKING blocks are skipped."""
    found = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking_only(child):
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, [], child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                found.extend(_from_import(child))
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if not (top_level_only and inner):
                visit(child, inner)

    visit(tree, False)
    return found


def _from_import(node: ast.ImportFrom) -> list[tuple[str, list[str], int]]:
    """`from a import b` imports module a.b where that is a module, else names of a."""
    out, names = [], []
    for alias in node.names:
        if f"{node.module}.{alias.name}" in MODULES:
            out.append((f"{node.module}.{alias.name}", [], node.lineno))
        else:
            names.append(alias.name)
    return out + [(node.module, names, node.lineno)]


@functools.cache
def imports_of(module: str, top_level_only: bool = False) -> tuple[tuple[str, tuple[str, ...], int], ...]:
    tree = ast.parse(MODULES[module].read_text())
    return tuple((name, tuple(names), line) for name, names, line in _imports(tree, top_level_only))


def package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in RANK) else None


def test_every_subpackage_has_a_rank():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(RANK), "rank new packages in RANK (and say why in docs/ARCHITECTURE.md)"


def test_imports_go_down():
    upward = []
    for module in MODULES:
        own = package_of(module)
        for target, _, line in imports_of(module):
            dep = package_of(target) if target.startswith("jaxinfer.") else None
            if own and dep and dep != own and RANK[dep] >= RANK[own]:
                upward.append(f"{MODULES[module].relative_to(REPO)}:{line} imports {target}")
    assert not upward, "\n".join(upward)


def test_no_import_circles():
    """Top-level imports only (a package __init__ re-exporting its own modules is no circle); the
    public `jaxinfer/__init__` imports from everywhere and nothing inside imports it."""
    graph = {m: {t for t, _, _ in imports_of(m, top_level_only=True) if t in MODULES and t != "jaxinfer"}
             for m in MODULES}
    cycles = _cycles(graph)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of more than one module (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return groups


def test_no_private_names_across_packages():
    crossing = []
    for module in MODULES:
        own = package_of(module)
        for target, names, line in imports_of(module):
            private = [n for n in names if n.startswith("_") and n != "__version__"]
            if target.startswith("jaxinfer.") and package_of(target) != own and private:
                crossing.append(f"{MODULES[module].relative_to(REPO)}:{line} imports {private} from {target}")
    assert not crossing, "\n".join(crossing)


def test_nothing_imports_the_entrypoints():
    allowed = {"jaxinfer", "jaxinfer.__main__"}
    callers = [
        f"{MODULES[m].relative_to(REPO)}:{line}"
        for m in MODULES if package_of(m) != "entrypoints" and m not in allowed
        for target, _, line in imports_of(m) if target.startswith("jaxinfer.entrypoints")
    ]
    assert not callers, "\n".join(callers)


def loads_accelerator_code(module: str, seen: set[str] | None = None) -> list[str]:
    """The import chain by which loading `module` (top-level imports) loads jax, or []."""
    seen = set() if seen is None else seen
    seen.add(module)
    parents = [".".join(module.split(".")[:i]) for i in range(2, len(module.split(".")))]
    for target, _, _ in imports_of(module, top_level_only=True):
        if target.split(".")[0] in ACCELERATOR_LIBRARIES:
            return [module, target]
    for target in [t for t, _, _ in imports_of(module, top_level_only=True)] + parents:
        if target in MODULES and target not in seen and target != "jaxinfer":
            chain = loads_accelerator_code(target, seen)
            if chain:
                return [module, *chain]
    return []


@pytest.mark.parametrize("module", sorted(m for m in MODULES if package_of(m) == "engine"))
def test_engine_host_side_imports_no_jax(module):
    chain = loads_accelerator_code(module)
    assert not chain, " -> ".join(chain)


def test_pallas_kernels_never_import_jaxinfer():
    offenders = []
    for path in sorted((REPO / "pallas_kernels").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            offenders += [f"{path.relative_to(REPO)}:{node.lineno}" for n in names if n.split(".")[0] == "jaxinfer"]
    assert not offenders, "\n".join(offenders)


def test_the_rules_catch_an_upward_import(tmp_path, monkeypatch):
    """The checks read real files: an engine module importing jax through runtime is caught."""
    monkeypatch.setitem(MODULES, "jaxinfer.engine.fake", tmp_path / "fake.py")
    (tmp_path / "fake.py").write_text("from jaxinfer.runtime.step_programs import packed_io\n")
    assert loads_accelerator_code("jaxinfer.engine.fake")[-1].split(".")[0] == "jax"
    (tmp_path / "fake.py").write_text("import numpy as np\n")
    imports_of.cache_clear()
    assert loads_accelerator_code("jaxinfer.engine.fake") == []
