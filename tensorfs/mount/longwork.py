"""Work too long for one FUSE request (a whole tensor's sha256), done off the request
threads (docs/internals/reliability.md, "One request does work bounded by that request").

An ask gets the value if it is done, else a ``Later`` (tensorfs.fuse.operations) that the
work settles: the session keeps the request and answers it then, so the asker simply
waits while no libfuse thread does.  One thread per mount does the work, one job at a
time, in the order asked; a job checks between pieces whether to go on (``check``), so that
an unmount or SIGTERM (``stop``: every waiting ask answered ECANCELED) never waits for more
than one piece, and a job that every asker gave up on (interrupted: a signal, a killed
client) stops as well, or never starts.

Nothing here knows model formats."""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable

from tensorfs.fuse.operations import FsError, Later

log = logging.getLogger("tensorfs")


class Cancelled(Exception):
    """The mount is ending, or no one waits for the job any more: it stops where it is."""


class LongWork:
    """One background thread that computes values by key, each once, in the order asked.

    ``result(key, work, what)``: the value of ``work(check)`` for ``key`` if it is done;
    else a ``Later`` settled with it (or with its error), ``work`` queued once for all
    the asks that wait.  ``work`` calls ``check()`` between pieces of its work; ``check``
    raises ``Cancelled`` once ``stop()`` was called or every ask of the job gave up.  A
    job that fails answers its error to the asks that waited; the next ask queues it
    again."""

    def __init__(self, name: str = "tensorfs-long-work"):
        self.name = name
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._done: dict = {}
        self._waiting: dict = {}            # key -> the Laters of the asks that wait
        self._queued: dict = {}             # key -> (work, what), in the order asked
        self._current = None
        self._abandoned = ""                # why no one waits for the running job any more
        self._stopping = False
        self._thread: threading.Thread | None = None
        # called once, at the first job queued (MountedModel.start: watch for a lazy unmount)
        self.on_first_job: Callable[[], None] | None = None

    def result(self, key, work, what: str):
        with self._lock:
            if key in self._done:
                return self._done[key]
            later = Later(on_give_up=lambda gone, code: self._left(key, gone, code))
            if self._stopping:
                later.fail(FsError(errno.ECANCELED))
                return later
            self._waiting.setdefault(key, []).append(later)
            if key == self._current:
                self._abandoned = ""
            elif key not in self._queued:
                self._queued[key] = (work, what)
                if self._thread is None:
                    # started at the first ask, in the serving process (a thread does not
                    # survive the daemon's fork)
                    self._thread = threading.Thread(target=self._run, name=self.name,
                                                    daemon=True)
                    self._thread.start()
                    if self.on_first_job is not None:
                        self.on_first_job()
                self._wake.notify()
        return later

    def _left(self, key, gone: Later, code: int) -> None:
        """An ask gave up (``code``: EINTR, its caller was interrupted; ECANCELED, its
        session is ending): if it was the job's last, the job is dropped (queued) or
        stopped at its next ``check`` (running)."""
        why = "the mount is ending" if code == errno.ECANCELED else "no one waits for it any more"
        with self._lock:
            waiting = self._waiting.get(key, [])
            if gone in waiting:
                waiting.remove(gone)
            if waiting:
                return
            self._waiting.pop(key, None)
            if key in self._queued:
                _, what = self._queued.pop(key)
                log.info("%s: dropped (%s)", what, why)
            elif key == self._current:
                self._abandoned = why

    def check(self) -> None:
        if self._stopping or self._abandoned:
            raise Cancelled()

    def stop(self) -> None:
        """End the work now: the job running stops at its next ``check``, the queued ones
        never start, every ask that waits is answered ECANCELED.  Does not wait (``close``
        does)."""
        with self._lock:
            self._stopping = True
            self._queued.clear()
            waiting, self._waiting = self._waiting, {}
            self._wake.notify_all()
        for laters in waiting.values():
            for later in laters:
                later.fail(FsError(errno.ECANCELED))

    def close(self, timeout: float = 5.0) -> None:
        """``stop``, then wait (at most ``timeout``) for the running job to let go of what
        it reads, before the caller closes it."""
        self.stop()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queued and not self._stopping:
                    self._wake.wait()
                if self._stopping:
                    return
                key = next(iter(self._queued))
                work, what = self._queued.pop(key)
                self._current, self._abandoned = key, ""
            started = time.monotonic()
            log.debug("%s: started", what)
            try:
                value = work(self.check)
            except Cancelled:
                with self._lock:
                    self._current = None
                    if self._stopping:
                        log.info("%s: cancelled (the mount is ending)", what)
                        return
                    if not self._waiting.get(key):
                        log.info("%s: cancelled (%s)", what, self._abandoned)
                        continue
                    self._queued[key] = (work, what)    # asked again meanwhile: start over
                continue
            except Exception as error:
                log.error("%s: failed: %s", what, error)
                if not isinstance(error, OSError):
                    error = OSError(errno.EIO, f"{what} failed: {error}")
                with self._lock:
                    self._current = None
                    waiting = self._waiting.pop(key, [])
                for later in waiting:
                    later.fail(error)
                continue
            log.debug("%s: done in %.1f s", what, time.monotonic() - started)
            with self._lock:
                self._done[key] = value
                self._current = None
                waiting = self._waiting.pop(key, [])
            for later in waiting:
                later.answer(value)
