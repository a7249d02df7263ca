"""Who waits for an answer that comes later: the processes whose requests a session keeps
(``Session._defer``), each watched through a pidfd by one thread, so that a request whose
caller is gone is given up at once.

The kernel sends no INTERRUPT for most reads: a read through the page cache (read-ahead),
an mmap's page fault and an ``O_DIRECT`` read go as background requests, never interrupted,
so a killed ``cat`` leaves its read waiting for the network.  The request still names the
thread that made it (``fuse_req_ctx``'s pid: its thread id); once that thread has exited,
no one reads the answer.

A thread id is watched with ``PIDFD_THREAD`` (Linux >= 6.9); before, only a process's main
thread can be watched (most readers: ``cat``, ``dd``, ``cp``); where neither works the
request waits as before, up to its own bound.  A killed ``O_DIRECT`` reader does not exit
while its read waits (the kernel waits for the answer uninterruptibly): a caller with a
SIGKILL pending (``/proc/TID/status``, looked at every ``KILLED_POLL_S`` while requests
wait) is gone too.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import threading
import time
from collections.abc import Callable

log = logging.getLogger("tensorfs")

PIDFD_THREAD = os.O_EXCL        # linux/pidfd.h: a pidfd for one thread, not its process
KILLED_POLL_S = 0.5
SIGKILL_BIT = 1 << (9 - 1)      # SIGKILL in /proc's signal masks


def killed(pid: int) -> bool:
    """Whether thread ``pid`` has a SIGKILL pending: it is dying, and waits only for the
    answer (an ``O_DIRECT`` read) before it exits."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith((b"SigPnd:", b"ShdPnd:")) \
                        and int(line.split()[1], 16) & SIGKILL_BIT:
                    return True
    except (OSError, ValueError, IndexError):
        return False
    return False


def pidfd(pid: int) -> int | None:
    """A pidfd that becomes readable once thread ``pid`` has exited; None where it cannot be
    watched (no such thread any more: ``ProcessLookupError``, raised)."""
    if pid <= 0:                # not in this daemon's pid namespace, or the kernel's own
        return None
    for flags in (PIDFD_THREAD, 0):
        try:
            return os.pidfd_open(pid, flags)
        except ProcessLookupError:
            raise
        except OSError as error:
            if error.errno not in (errno.EINVAL, errno.ENOSYS, errno.EPERM):
                log.debug("cannot watch pid %d: %s", pid, error)
                return None
    return None


class Requesters:
    """One thread that polls the pidfds of the callers that wait, plus a wake descriptor;
    ``watch(key, pid, gone)`` calls ``gone()`` once thread ``pid`` has exited, unless
    ``forget(key)`` came first.  Descriptors are closed by the watching thread only, between
    two polls, so none it polls is ever another file."""

    def __init__(self):
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[int, Callable[[], None], int]] = {}
        self._closing: list[int] = []
        self._wake: int | None = None
        self._pid = 0

    def watch(self, key: int, pid: int, gone: Callable[[], None]) -> None:
        try:
            fd = pidfd(pid)
        except ProcessLookupError:
            gone()                  # the caller has gone already
            return
        if fd is None:
            return
        with self._lock:
            if self._pid != os.getpid():    # made in the process that serves
                self._pid, self._wake, self._watched = os.getpid(), os.eventfd(0), {}
                threading.Thread(target=self._run, args=(self._wake,),
                                 name="tensorfs-requesters", daemon=True).start()
            self._watched[key] = (fd, gone, pid)
            wake = self._wake
        os.eventfd_write(wake, 1)

    def forget(self, key: int) -> None:
        with self._lock:
            entry = self._watched.pop(key, None)
            if entry is None:
                return
            self._closing.append(entry[0])
            wake = self._wake
        if wake is not None:
            os.eventfd_write(wake, 1)

    def forget_all(self) -> None:
        with self._lock:
            keys = list(self._watched)
        for key in keys:
            self.forget(key)

    def _run(self, wake: int) -> None:
        check = time.monotonic() + KILLED_POLL_S
        while True:
            with self._lock:
                closing, self._closing = self._closing, []
                polled = {entry[0]: key for key, entry in self._watched.items()}
            for fd in closing:
                os.close(fd)
            poller = select.poll()
            poller.register(wake, select.POLLIN)
            for fd in polled:
                poller.register(fd, select.POLLIN)
            now = time.monotonic()
            ready = poller.poll(max(0.0, check - now) * 1000 if polled else None)
            if polled and time.monotonic() >= check:    # requests wait: any caller dying?
                check = time.monotonic() + KILLED_POLL_S
                with self._lock:
                    pids = {key: entry[2] for key, entry in self._watched.items()}
                ready += [(fd, 0) for fd, key in polled.items()
                          if key in pids and killed(pids[key])]
            elif not polled:
                check = time.monotonic() + KILLED_POLL_S
            for fd, _ in ready:
                if fd == wake:
                    os.eventfd_read(wake)
                    continue
                with self._lock:
                    entry = self._watched.get(polled[fd])
                    if entry is None or entry[0] != fd:
                        continue
                    del self._watched[polled[fd]]
                    self._closing.append(fd)
                try:
                    entry[1]()
                except Exception:       # a caller's own failure: nothing above to raise to
                    log.exception("a request whose caller is gone could not be given up")
