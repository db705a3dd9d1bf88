"""The layer map of ``docs/architecture.md``, checked on every import of the package.

Every ``import`` and ``from ... import`` in ``lpserve/`` (at module level and inside
functions) is resolved to the module it names; the test fails on an import that runs
against the layer map, on any import circle between modules, and on any private name
(or private module) taken from another package or module.
"""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2] / "lpserve"

#: group -> layer; a module may import from its own group or from a lower layer,
#: except where ``FORBIDDEN`` says otherwise (``lpserve`` itself is the lazy facade).
LAYERS = {
    "lpserve.arrays": -1, "lpserve.trace": 0, "lpserve.cluster": 0,
    "lpserve.cost": 1,
    "lpserve.instance": 2, "lpserve.objectives": 2,
    "lpserve.policy": 3,
    "lpserve.kernels": 3.5,  # numba kernels shared by policies and sim
    "lpserve.policies": 4, "lpserve.sim": 4,
    "lpserve.opt": 5,  # 4': may import policies (export() returns a policy) and sim
    "lpserve.registry": 6,
    "lpserve.evaluate": 7, "lpserve.testing": 7,
    "lpserve.sweep": 8, "lpserve.adapters": 8,
    "lpserve.commands": 9,
    "lpserve.cli": 10,
    "lpserve": 11,
}
#: pairs of groups that never import each other although the layers would allow it
FORBIDDEN = {("lpserve.policies", "lpserve.sim"), ("lpserve.sim", "lpserve.policies")}


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = ("lpserve",) + p.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _group(mod: str) -> str:
    best = ""
    for g in LAYERS:
        if (mod == g or mod.startswith(g + ".")) and len(g) > len(best):
            best = g
    return best


def _package(mod: str, path: Path) -> str:
    return mod if path.name == "__init__.py" else mod.rpartition(".")[0]


def _imports(mod: str, path: Path) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every lpserve import."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg = _package(mod, path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((a.name, None, node.lineno) for a in node.names
                       if a.name == "lpserve" or a.name.startswith("lpserve."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target != "lpserve" and not target.startswith("lpserve."):
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                if sub in MODULES:  # `from pkg import module`
                    out.append((sub, None, node.lineno))
                else:
                    out.append((target, a.name, node.lineno))
    return out


EDGES = [(mod, target, name, line) for mod, path in MODULES.items()
         for target, name, line in _imports(mod, path)]


def test_every_module_has_a_layer():
    missing = [m for m in MODULES if not _group(m)]
    assert not missing, f"modules outside the layer map: {missing}"


def test_imports_follow_the_layer_map():
    bad = []
    for mod, target, name, line in EDGES:
        g, h = _group(mod), _group(target)
        if g == h:
            continue
        if LAYERS[h] >= LAYERS[g] or (g, h) in FORBIDDEN:
            bad.append(f"{MODULES[mod].relative_to(ROOT.parent)}:{line} {g} (layer "
                       f"{LAYERS[g]}) imports {target} (layer {LAYERS[h]})")
    assert not bad, "imports against the layer map:\n" + "\n".join(bad)


def test_no_import_circles():
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    for mod, target, _, _ in EDGES:
        if target in MODULES and target != mod:
            graph.add_edge(mod, target)
    # a package's __init__ that re-exports its submodules is not a circle with them
    for mod, path in MODULES.items():
        if path.name == "__init__.py":
            for t in list(graph.successors(mod)):
                if t.startswith(mod + "."):
                    graph.remove_edge(mod, t)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c + [c[0]]) for c in cycles)


def test_no_private_name_from_another_module():
    bad = []
    for mod, target, name, line in EDGES:
        src_pkg = _package(mod, MODULES[mod])
        priv_mod = [p for p in target.split(".") if p.startswith("_")]
        tgt_pkg = target if (target in MODULES and MODULES[target].name == "__init__.py") \
            else target.rpartition(".")[0]
        if priv_mod and tgt_pkg != src_pkg:
            bad.append(f"{MODULES[mod].relative_to(ROOT.parent)}:{line} imports the private "
                       f"module {target}")
        if name is not None and name.startswith("_") and not name.startswith("__") \
                and target != mod:
            bad.append(f"{MODULES[mod].relative_to(ROOT.parent)}:{line} imports the private "
                       f"name {target}.{name}")
    assert not bad, "private names taken from another module:\n" + "\n".join(bad)


def _private_defined(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, methods, assigned attributes."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return {n for n in out if n.startswith("_") and not n.startswith("__")}


def test_no_private_attribute_of_another_module():
    """``obj._name`` where ``obj`` is not ``self``/``cls`` and ``_name`` is defined in
    another module: a private method or attribute used across modules."""
    trees = {m: ast.parse(p.read_text(), filename=str(p)) for m, p in MODULES.items()}
    defined = {m: _private_defined(t) for m, t in trees.items()}
    everywhere = set().union(*defined.values())
    bad = []
    for mod, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr in everywhere and node.attr not in defined[mod]:
                bad.append(f"{MODULES[mod].relative_to(ROOT.parent)}:{node.lineno} uses "
                           f"{ast.unparse(node)}")
    assert not bad, "private attributes of other modules:\n" + "\n".join(bad)


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_no_file_past_600_lines(mod):
    n = len(MODULES[mod].read_text().splitlines())
    assert n <= 600, f"{MODULES[mod].relative_to(ROOT.parent)} has {n} lines (limit 600)"
