"""The house plan: the spec's faces at the root, the machinery in grpokit/, imports only going down.

Read from the source with `ast` (every import, module-level or inside a function), so a lazy import that climbs
back up counts as much as a top-level one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

FACES = {"train_grpo", "grpo_trainer"}  # the entry points: nothing imports them but tests


def _modules() -> dict[str, Path]:
    found = {}
    for path in [*ROOT.glob("*.py"), *ROOT.glob("config/*.py"), *ROOT.glob("rewards/*.py"),
                 *ROOT.glob("rewards/code/*.py"), *ROOT.glob("grpokit/*.py")]:
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(imported module of ours, names taken from it) for every import statement in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names if alias.name in modules]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [alias.name for alias in node.names]
            if node.module in modules:
                submodules = [n for n in names if f"{node.module}.{n}" in modules]
                out += [(f"{node.module}.{n}", []) for n in submodules]
                rest = [n for n in names if n not in submodules]
                if rest or not submodules:
                    out.append((node.module, rest))
    return out


def _graph():
    modules = _modules()
    return modules, {name: _imports(path, modules) for name, path in modules.items()}


def test_no_import_cycles():
    modules, graph = _graph()
    edges = {name: {target for target, _ in imports if target != name} for name, imports in graph.items()}
    # a package imports its own modules from __init__ (rewards, config): that is the package's face, not a cycle
    for package in ("config", "rewards", "rewards.code"):
        edges[package] = {t for t in edges[package] if not t.startswith(package + ".")}
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path, node, target]))
            if target not in state:
                visit(target, [*path, node])
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [])


def test_nothing_imports_the_entry_points():
    _, graph = _graph()
    for name, imports in graph.items():
        if name not in FACES:
            assert not {t for t, _ in imports} & FACES, f"{name} imports an entry point"


def test_grpokit_modules_import_only_modules_below_them():
    """grpokit/__init__.py lists its modules top to bottom; each may import only the ones listed after it."""
    doc = (ROOT / "grpokit" / "__init__.py").read_text()
    order = [m.group(1) for m in re.finditer(r"^    (\w+)\.py ", doc, re.M)]
    on_disk = sorted(p.stem for p in (ROOT / "grpokit").glob("*.py") if p.stem != "__init__")
    assert sorted(order) == on_disk, "grpokit/__init__.py's map must list every module once"
    _, graph = _graph()
    for i, name in enumerate(order):
        for target, _ in graph[f"grpokit.{name}"]:
            if target.startswith("grpokit."):
                assert order.index(target.split(".")[1]) > i, f"grpokit.{name} imports {target}, listed above it"


def test_no_private_names_across_modules():
    _, graph = _graph()
    for name, imports in graph.items():
        for target, names in imports:
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            assert not private, f"{name} imports private {private} from {target}"
