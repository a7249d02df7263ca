"""Fixtures and hooks of the whole suite: run the real ``tensorfs`` command and mount for
real.  The helpers themselves live in ``tests.support`` (import them from there); the names
tests imported from here before are re-exported.

Markers (registered in pyproject.toml): ``remote`` (every test under tests/remote/, set
here by its folder), ``slow`` (a test, or a file's ``pytestmark``, that takes more than a few
seconds on its own: marked where it is written).  ``pytest -m
"not slow and not remote"`` runs the fast part alone; ``make test`` runs everything.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

# the helpers' asserts explain themselves as the tests' do (registered before the import)
pytest.register_assert_rewrite("tests.support")
from tests.support import RUNTIME_DIR, fuse_mounts_under, mounts_in  # noqa: E402 (as above)
from tests.support.mounts import shared_directory  # noqa: E402 (as above)

_REMOTE = Path(__file__).resolve().parent / "remote"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _REMOTE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.remote)


def pytest_unconfigure(config):
    shutil.rmtree(RUNTIME_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def users():
    """Two real non-root users (victim, attacker) for the session: one fixture for every
    module, so that no two modules try to make the same users."""
    from tests.support.users import make_users

    yield from make_users()


@pytest.fixture
def mount(tmp_path):
    """mount(model, *options) -> mount point; everything mounted is unmounted afterwards."""
    yield from mounts_in(tmp_path)
    assert fuse_mounts_under(tmp_path) == []


@pytest.fixture
def shared_dir():
    """A directory every user can enter and read (tests.support.mounts.shared_directory),
    with what is mounted below it detached afterwards."""
    yield from shared_directory()
