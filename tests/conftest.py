"""Fixtures and hooks of the whole suite: run the real ``tensorfs`` command and mount for
real.  The helpers themselves live in ``tests.support`` (import them from there); the names
tests imported from here before are re-exported.

Markers (registered in pyproject.toml): ``remote`` (every test under tests/remote/, set
here), ``slow`` (a test or file that takes more than a few seconds on its own).  ``pytest -m
"not slow and not remote"`` runs the fast part alone; ``make test`` runs everything.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support import (RUNTIME_DIR, TENSORFS, fuse_mounts_under,  # noqa: F401 (re-exported)
                           mounts_in, run_tensorfs)

_REMOTE = Path(__file__).resolve().parent / "remote"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _REMOTE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.remote)


def pytest_unconfigure(config):
    shutil.rmtree(RUNTIME_DIR, ignore_errors=True)


@pytest.fixture
def mount(tmp_path):
    """mount(model, *options) -> mount point; everything mounted is unmounted afterwards."""
    yield from mounts_in(tmp_path)
    assert fuse_mounts_under(tmp_path) == []
