"""The mount's long work (tensorfs/mount/longwork.py) and the ``Later`` it answers with
(tensorfs/fuse/operations.py), driven by hand: which asks a job answers, when a job no one
waits for stops, what an ending mount answers.  Each work function blocks on an Event the
test sets, so nothing here depends on timing; the mount-level cases are in
tests/mount/test_xattrs.py and tests/cli/test_shutdown.py."""

from __future__ import annotations

import errno
import threading

import pytest

from tensorfs.fuse.operations import Later
from tensorfs.mount.longwork import LongWork


def _outcome(later: Later) -> dict:
    """What ``later`` delivers, as the session would take it."""
    got: dict = {}
    done = threading.Event()

    def deliver(ok, value):
        got["value" if ok else "errno"] = value if ok else value.errno
        done.set()

    later.deliver_to(deliver)
    got["done"] = done
    return got


class Gate:
    """A job that reports its start, then checks between pieces until opened."""

    def __init__(self, value=b"v"):
        self.started, self.open, self.ended = threading.Event(), threading.Event(), threading.Event()
        self.runs, self.value, self.stopped = 0, value, False

    def __call__(self, check):
        self.runs += 1
        self.started.set()
        try:
            while not self.open.wait(0.01):
                check()
            check()
            return self.value
        except BaseException:
            self.stopped = True
            raise
        finally:
            self.ended.set()


@pytest.fixture
def work():
    w = LongWork("test-long-work")
    yield w
    w.close()


def test_two_asks_share_one_job_and_both_get_its_value(work):
    gate = Gate()
    a, b = _outcome(work.result("k", gate, "k")), _outcome(work.result("k", gate, "k"))
    assert gate.started.wait(10)
    gate.open.set()
    assert a["done"].wait(10) and b["done"].wait(10)
    assert a["value"] == b["value"] == b"v" and gate.runs == 1
    assert work.result("k", gate, "k") == b"v"              # kept: a plain value now


def test_an_ask_that_gives_up_leaves_the_job_to_the_other(work):
    gate = Gate()
    first = work.result("k", gate, "k")
    second = _outcome(work.result("k", gate, "k"))
    got = _outcome(first)
    assert gate.started.wait(10)
    first.give_up(errno.EINTR)
    assert got == {"errno": errno.EINTR, "done": got["done"]}
    gate.open.set()
    assert second["done"].wait(10) and second["value"] == b"v" and gate.runs == 1


def test_a_job_no_one_waits_for_stops_and_starts_over_when_asked_again(work):
    gate = Gate()
    later = work.result("k", gate, "job k")
    assert gate.started.wait(10)
    later.give_up(errno.EINTR)
    assert gate.ended.wait(10) and gate.stopped             # never opened: it was stopped
    again = Gate()
    got = _outcome(work.result("k", again, "job k"))
    again.open.set()
    assert got["done"].wait(10) and got["value"] == b"v"


def test_a_queued_job_no_one_waits_for_never_starts(work):
    running, queued = Gate(), Gate()
    first = _outcome(work.result("a", running, "a"))
    assert running.started.wait(10)
    work.result("b", queued, "b").give_up(errno.EINTR)
    running.open.set()
    queued.open.set()
    assert first["done"].wait(10)
    work.close()
    assert queued.runs == 0


def test_the_end_answers_every_wait_ecanceled_and_every_ask_after(work):
    gate = Gate()
    waiting = _outcome(work.result("k", gate, "k"))
    assert gate.started.wait(10)
    work.stop()
    assert waiting["done"].wait(10) and waiting["errno"] == errno.ECANCELED
    late = _outcome(work.result("other", Gate(), "other"))
    assert late["done"].wait(10) and late["errno"] == errno.ECANCELED


def test_a_failed_job_answers_its_error_and_the_next_ask_starts_it_again(work):
    def broken(check):
        raise OSError(errno.EIO, "the model changed")

    got = _outcome(work.result("k", broken, "k"))
    assert got["done"].wait(10) and got["errno"] == errno.EIO
    gate = Gate()
    gate.open.set()
    again = _outcome(work.result("k", gate, "k"))
    assert again["done"].wait(10) and again["value"] == b"v"



def test_an_ask_right_after_the_last_gave_up_still_gets_the_value(work):
    """Whether the job saw it was abandoned before the new ask came (it starts over) or
    not (it goes on), the new ask is answered with the value."""
    gate = Gate()
    work.result("k", gate, "k").give_up(errno.EINTR)
    got = _outcome(work.result("k", gate, "k"))
    gate.open.set()
    assert got["done"].wait(10) and got["value"] == b"v"
