"""numpy and gguf come into tensorfs one way: ``from tensorfs.runtime.libraries import np``
(or ``gguf``), which imports them whole under one lock, since a mount imports them at the
first request that needs them, on whichever libfuse thread asks (tests/mount/test_first_numpy.py).
Every module of the package is read (its syntax tree: nothing is imported); an ``import``
of numpy or gguf, or of a submodule, is allowed only under ``if TYPE_CHECKING:``."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tensorfs"
HELPER = PACKAGE / "runtime" / "libraries.py"
LIBRARIES = ("numpy", "gguf")


def _is_library(name: str | None) -> bool:
    return name is not None and any(name == lib or name.startswith(lib + ".") for lib in LIBRARIES)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def direct_imports(tree: ast.AST) -> list[int]:
    """Lines that import numpy or gguf themselves, outside ``if TYPE_CHECKING:``."""
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import) and any(_is_library(a.name) for a in node.names):
            found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_library(node.module):
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and _is_library(node.args[0].value) \
                and isinstance(node.func, (ast.Attribute, ast.Name)) \
                and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) \
                in ("import_module", "__import__"):
            found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def test_only_the_helper_imports_numpy_and_gguf():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == HELPER:
            continue
        lines = direct_imports(ast.parse(path.read_text(), str(path)))
        if lines:
            offenders[str(path.relative_to(PACKAGE.parent))] = lines
    assert offenders == {}, "import them through tensorfs.runtime.libraries"


def test_the_check_sees_each_way_of_importing():
    source = """
import numpy as np
from numpy.lib import format
import gguf.quants
def f():
    from gguf import quants
    importlib.import_module("numpy")
if TYPE_CHECKING:
    import numpy as np
from tensorfs.runtime.libraries import np
"""
    assert direct_imports(ast.parse(source)) == [2, 3, 4, 6, 7]
