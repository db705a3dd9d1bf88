"""Every public definition in ``lpserve/`` has a docstring.

Public means: a module-level function or class, or a method of a public class (nested
public classes included), whose name has no leading underscore, in a module whose path
has no private part (``_kernels.py``, ``_order.py``). Dunder methods are left out (their
meaning is Python's); a property's setter or deleter shares the getter's docstring.
Functions defined inside functions are not public API and are not checked.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "lpserve"

#: folders (relative to the repository root) exempt from the check; none is
NOT_YET_DOCUMENTED: list[str] = []


def _public_modules() -> list[Path]:
    out = []
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT.parent)
        if any(rel.as_posix() == d or rel.as_posix().startswith(d + "/")
               for d in NOT_YET_DOCUMENTED):
            continue
        parts = rel.with_suffix("").parts
        if any(part.startswith("_") and part != "__init__" for part in parts):
            continue
        out.append(p)
    return out


def _is_accessor(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """``@name.setter`` / ``@name.deleter``: documented by the property's getter."""
    return any(isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter")
               for d in node.decorator_list)


def _undocumented(body: list[ast.stmt], prefix: str, in_class: bool) -> list[tuple[str, int]]:
    out = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = node.name
            if name.startswith("_") or (in_class and _is_accessor(node)):
                continue
            if ast.get_docstring(node) is None:
                out.append((prefix + name, node.lineno))
        elif isinstance(node, ast.ClassDef):
            if node.name.startswith("_"):
                continue
            if ast.get_docstring(node) is None:
                out.append((prefix + node.name, node.lineno))
            out.extend(_undocumented(node.body, f"{prefix}{node.name}.", True))
        elif isinstance(node, ast.If):  # `if TYPE_CHECKING:` / version branches
            out.extend(_undocumented(node.body + node.orelse, prefix, in_class))
    return out


def undocumented() -> list[str]:
    """``path:line name`` for every public definition without a docstring."""
    out = []
    for p in _public_modules():
        tree = ast.parse(p.read_text(), filename=str(p))
        rel = p.relative_to(ROOT.parent).as_posix()
        out.extend(f"{rel}:{line} {name}" for name, line in _undocumented(tree.body, "", False))
    return out


def test_checker_sees_the_package():
    mods = _public_modules()
    assert len(mods) > 50, f"only {len(mods)} public modules found under {ROOT}"


def test_checker_catches_a_missing_docstring():
    tree = ast.parse("def f():\n    pass\nclass C:\n    '''doc'''\n    def m(self):\n"
                     "        pass\n    def __eq__(self, o):\n        pass\n"
                     "    @property\n    def p(self):\n        '''doc'''\n"
                     "    @p.setter\n    def p(self, v):\n        pass\n"
                     "def _private():\n    pass\n")
    assert [n for n, _ in _undocumented(tree.body, "", False)] == ["f", "C.m"]


def test_every_public_definition_has_a_docstring():
    missing = undocumented()
    assert not missing, (f"{len(missing)} public definitions without a docstring:\n"
                         + "\n".join(missing))


if __name__ == "__main__":  # the list, for working through it
    print("\n".join(undocumented()))
