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
# ``slow``, kept here rather than in each file (others' files stay as they are): whole files
# whose every test runs for seconds, and single tests of several seconds (pytest
# --durations on the full suite); a test may also carry @pytest.mark.slow itself.
_SLOW_FILES = {"test_concurrency.py", "test_libfuse_matrix.py", "test_fuzz.py",
               "test_shutdown.py", "test_workers.py"}
_SLOW_TESTS = ("test_trust_data.py::test_every_entry_of_a_mount_fits_name_max",
               "test_trust_data.py::test_a_name_shape_costs_memory_linear_in_the_file",
               "test_trust_data.py::test_generated_files_larger_than_the_cache_cost_one_generation",
               "test_api.py::test_refused_models_raise_the_model_error_the_cli_prints",
               "test_cli.py::test_any_names_are_reachable_through_the_mount",
               "test_namespace.py::test_lazy_tree_places_files_where_tensor_paths_says",
               "test_faults.py::test_source_on_a_slow_filesystem")


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if _REMOTE in path.parents:
            item.add_marker(pytest.mark.remote)
        test = f"{path.name}::{item.name.split('[')[0]}"
        if path.name in _SLOW_FILES or test in _SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


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
