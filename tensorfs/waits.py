"""Reads that wait without a thread, put together: a read whose bytes are on their way is a
``concurrent.futures.Future`` of its count (``Source.read_or_wait``, ``View.read_or_wait``),
and a read made of such reads, or of one and work after it, is a ``Future`` of its own.
Cancelling the outer one (its reader is gone) cancels what it waits for.

- ``gathered``: a read made of parts, some here already and some on their way (an .npy's
  header and its data, a composed file's pieces);
- ``then``: a read whose bytes come first and are then worked on (a converted view's
  stored bytes, converted once here).
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import os
import threading
import time
from concurrent.futures import Executor, Future
from typing import Callable


def gathered(total: int, waits: list[tuple[int, int, Future[int]]]) -> Future[int]:
    """A Future of a read's count once every part in ``waits`` came, each ``(where it starts
    in the read, how many bytes it asked for, its Future)``, in order: ``total``, or where
    one came short, the count up to its end (a read stops at a short part); failed with the
    first part's failure; cancelling it cancels them all."""
    out: Future[int] = Future()
    left = [len(waits)]
    lock = threading.Lock()

    def came(_done: Future[int]) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        if not out.set_running_or_notify_cancel():
            return
        count = total
        for at, n, future in waits:         # in order: the first short part ends the read
            if future.cancelled():
                out.set_exception(OSError(errno.EINTR, "a part of the read was given up"))
                return
            error = future.exception()
            if error is not None:
                out.set_exception(error)
                return
            if future.result() < n:
                count = at + future.result()
                break
        out.set_result(count)

    out.add_done_callback(lambda o: [f.cancel() for _, _, f in waits] if o.cancelled() else None)
    for _, _, future in waits:
        future.add_done_callback(came)
    return out


def then(future: Future[int], work: Callable[[], int], run: Executor, what: str
         ) -> Future[int]:
    """A Future of ``work()``'s count, run by ``run`` once ``future`` is done (the bytes
    ``work`` needs are here); failed as ``future`` failed or as ``work`` raised, with
    EAGAIN (naming ``what``) where ``run`` has no thread to give; cancelling it before
    ``work`` starts cancels ``future``."""
    out: Future[int] = Future()

    def work_now() -> None:
        if not out.set_running_or_notify_cancel():
            return
        try:
            out.set_result(work())
        except BaseException as error:      # any exception: the read's
            out.set_exception(error)

    def came(done: Future[int]) -> None:
        if done.cancelled():
            out.cancel()
            return
        error = done.exception()
        if error is not None:
            if out.set_running_or_notify_cancel():
                out.set_exception(error)
            return
        try:
            run.submit(work_now)
        except RuntimeError as error:       # no thread to be had: the read fails, one line
            if out.set_running_or_notify_cancel():
                out.set_exception(OSError(errno.EAGAIN, f"{what}: {error}"))

    future.add_done_callback(came)
    out.add_done_callback(lambda o: future.cancel() if o.cancelled() else None)
    return out


class Timers:
    """One thread (named ``name``) that calls each ``fn`` given to ``add`` at its time
    (``time.monotonic``), unless ``cancel`` came first: the deadlines of reads and requests
    that wait without a thread of their own.  The thread is made in the process that uses
    it (a daemon forks after import)."""

    def __init__(self, name: str):
        self._name = name
        self._cond = threading.Condition()
        self._heap: list = []
        self._order = itertools.count()
        self._pid = 0

    def add(self, when: float, fn: Callable[[], None]) -> list:
        entry = [when, next(self._order), fn]
        with self._cond:
            if self._pid != os.getpid():        # made in the process that uses it
                self._pid, self._heap = os.getpid(), []
                threading.Thread(target=self._run, name=self._name, daemon=True).start()
            heapq.heappush(self._heap, entry)
            if self._heap[0] is entry:
                self._cond.notify()
        return entry

    @staticmethod
    def cancel(entry: list) -> None:
        entry[2] = None                 # what it would have called is let go now

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][2] is None:
                        heapq.heappop(self._heap)
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        fn = heapq.heappop(self._heap)[2]
                        break
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
            try:
                fn()
            except Exception:           # a deadline's own failure: nothing above to raise to
                logging.getLogger("tensorfs").exception(f"{self._name}: a deadline failed "
                                                        "unexpectedly")
