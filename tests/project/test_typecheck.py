"""The FUSE contract is whole: every handler ``tensorfs.fuse.session.Session`` calls on its
filesystem is declared, and documented, by ``tensorfs.fuse.operations.Operations``, and the
adapter serves the mount through that interface (``make test`` also runs mypy over
``tensorfs/``: pyproject.toml ``[tool.mypy]``)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from tensorfs.fuse.operations import Operations
from tensorfs.mount.adapter import TensorFS

SESSION = Path(__file__).resolve().parents[2] / "tensorfs" / "fuse" / "session.py"


def _called_on_fs() -> set[str]:
    """The names of every ``self.fs.NAME(...)`` call in session.py."""
    called = set()
    for node in ast.walk(ast.parse(SESSION.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Attribute) and owner.attr == "fs" \
                    and isinstance(owner.value, ast.Name) and owner.value.id == "self":
                called.add(node.func.attr)
    return called


def test_operations_declares_every_handler_the_session_calls():
    called = _called_on_fs()
    assert len(called) >= 20
    declared = {name for name, _ in inspect.getmembers(Operations, inspect.isfunction)}
    assert called - declared == set()
    for name in called:
        assert inspect.getdoc(getattr(Operations, name)), f"Operations.{name} is not documented"


def test_the_adapter_keeps_each_handler_s_signature():
    for name, declared in inspect.getmembers(Operations, inspect.isfunction):
        served = getattr(TensorFS, name)
        assert list(inspect.signature(served).parameters) == \
            list(inspect.signature(declared).parameters), name
