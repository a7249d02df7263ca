"""Numbers a user hands tensorfs that overflow further down (the audit's instances of the
"numbers that overflow" class beyond the review's): each is one clear line at parse time."""

from __future__ import annotations

import pytest

from tests.support import run_tensorfs, usage_error
from tests.support.models import write_safetensors
from tests.support.servers import Nginx


@pytest.fixture
def served(tmp_path):
    server = Nginx(tmp_path / "nginx")
    model = tmp_path / "model.safetensors"
    write_safetensors(model)
    server.put("files/model.safetensors", model)
    server.start()
    yield f"{server.url}/files/model.safetensors"
    server.stop()


@pytest.mark.remote
@pytest.mark.parametrize("timeout", ["1e10", "1e308", "inf", "nan", "0", "-5"])
def test_a_timeout_no_clock_can_wait_is_one_line_at_parse_time(served, timeout):
    """[--timeout 1e10 with a URL: `internal error: OverflowError: timestamp out of range
    for platform time_t`; 1e308 and inf: "cannot convert float infinity to integer" blamed
    on the URL.]"""
    for command in ("inspect", "hash"):
        result = run_tensorfs(command, served, "--timeout", timeout, timeout=60)
        assert usage_error(result) == (f"tensorfs: error: argument --timeout: not a number of "
                                       f"seconds: '{timeout}' (more than 0, at most 86400)")


@pytest.mark.remote
def test_the_longest_timeout_allowed_still_reads(served):
    result = run_tensorfs("inspect", served, "--timeout", "86400", timeout=60)
    assert result.returncode == 0, result.stderr
