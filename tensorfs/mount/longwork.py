"""Work too long for one FUSE request (a whole tensor's sha256), done off the request
threads (docs/reliability.md, "One request does work bounded by that request").

A request never waits for it: it gets the result when it is ready, or ``NotReady`` (EAGAIN)
at once, the work queued by that ask.  One thread per mount does the work, one job at a
time, in the order asked; a job checks between pieces whether the mount is ending
(``stop``), so that an unmount or SIGTERM never waits for more than one piece.  A killed
client leaves nothing behind but the queued job, which ends with the mount.

Nothing here knows FUSE or model formats."""

from __future__ import annotations

import errno
import logging
import threading
import time

log = logging.getLogger("tensorfs")


class NotReady(BlockingIOError):
    """Asked for, not done yet: ask again later (EAGAIN)."""

    def __init__(self, what: str):
        super().__init__(errno.EAGAIN, f"{what}: being computed, ask again later")


class Cancelled(Exception):
    """The mount is ending: the job stops where it is."""


class LongWork:
    """One background thread that computes values by key, each once, in the order asked.

    ``result(key, work, what)``: the value of ``work(check)`` for ``key`` if it is done;
    else ``NotReady``, ``work`` queued once.  ``work`` calls ``check()`` between pieces of
    its work; ``check`` raises ``Cancelled`` once ``stop()`` was called.  A job that fails
    answers its error to the next ask (once; the ask after that queues it again)."""

    def __init__(self, name: str = "tensorfs-long-work"):
        self.name = name
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._done: dict = {}
        self._failed: dict = {}
        self._queued: dict = {}             # key -> (work, what), in the order asked
        self._current = None
        self._stopping = False
        self._thread: threading.Thread | None = None

    def result(self, key, work, what: str):
        with self._lock:
            if key in self._done:
                return self._done[key]
            error = self._failed.pop(key, None)
            if error is not None:
                raise error
            if not self._stopping and key not in self._queued and key != self._current:
                self._queued[key] = (work, what)
                if self._thread is None:
                    # started at the first ask, in the serving process (a thread does not
                    # survive the daemon's fork)
                    self._thread = threading.Thread(target=self._run, name=self.name,
                                                    daemon=True)
                    self._thread.start()
                self._wake.notify()
        raise NotReady(what)

    def check(self) -> None:
        if self._stopping:
            raise Cancelled()

    def stop(self) -> None:
        """End the work now: the job running stops at its next ``check``, the queued ones
        never start.  Does not wait (``close`` does)."""
        with self._lock:
            self._stopping = True
            self._queued.clear()
            self._wake.notify_all()

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
                self._current = key
            started = time.monotonic()
            log.debug("%s: started", what)
            try:
                value = work(self.check)
            except Cancelled:
                log.info("%s: cancelled (the mount is ending)", what)
                return
            except Exception as error:
                log.error("%s: failed: %s", what, error)
                if not isinstance(error, OSError):
                    error = OSError(errno.EIO, f"{what} failed: {error}")
                with self._lock:
                    self._failed[key] = error
                    self._current = None
                continue
            log.debug("%s: done in %.1f s", what, time.monotonic() - started)
            with self._lock:
                self._done[key] = value
                self._current = None
