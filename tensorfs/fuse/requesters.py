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


def _ready(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


class Requesters:
    """One thread that waits on an epoll set of the pidfds of the callers that wait;
    ``watch(key, pid, gone)`` calls ``gone()`` once thread ``pid`` has exited (or has a
    SIGKILL pending), unless ``forget(key)`` came first.  Watching and forgetting touch the
    epoll set from the caller's thread, under one lock: the watching thread is not woken
    for either (a read that waits costs four system calls, no thread switch), except to
    start looking at pending SIGKILLs once it sleeps with nothing to watch."""

    def __init__(self):
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[int, Callable[[], None], int]] = {}  # key: fd, gone, pid
        self._keys: dict[int, int] = {}         # fd -> key
        self._epoll: select.epoll | None = None
        self._wake = -1
        self._sleeping = False
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
                self._pid, self._watched, self._keys = os.getpid(), {}, {}
                self._epoll, self._wake = select.epoll(), os.eventfd(0)
                self._epoll.register(self._wake, select.EPOLLIN)
                threading.Thread(target=self._run, args=(self._epoll, self._wake),
                                 name="tensorfs-requesters", daemon=True).start()
            self._watched[key] = (fd, gone, pid)
            self._keys[fd] = key
            self._epoll.register(fd, select.EPOLLIN)
            if self._sleeping:
                self._sleeping = False
                os.eventfd_write(self._wake, 1)

    def forget(self, key: int) -> None:
        with self._lock:
            if key in self._watched:
                self._drop(key)

    def forget_all(self) -> None:
        with self._lock:
            for key in list(self._watched):
                self._drop(key)

    def _drop(self, key: int) -> Callable[[], None]:
        """Stop watching ``key`` (lock held): its pidfd leaves the set and is closed."""
        fd, gone, _ = self._watched.pop(key)
        del self._keys[fd]
        if self._epoll is not None:
            self._epoll.unregister(fd)
        os.close(fd)
        return gone

    def _run(self, epoll: select.epoll, wake: int) -> None:
        check = time.monotonic() + KILLED_POLL_S
        while True:
            with self._lock:
                self._sleeping = not self._watched
                timeout = None if self._sleeping else max(0.0, check - time.monotonic())
            events = epoll.poll(timeout)
            gone = []
            with self._lock:
                self._sleeping = False
                for fd, _ in events:
                    if fd == wake:
                        os.eventfd_read(wake)
                        continue
                    key = self._keys.get(fd)
                    # an event read just before its fd was forgotten, and the number
                    # given to another caller's pidfd since: that one must be ready too
                    if key is not None and _ready(fd):
                        gone.append(self._drop(key))
                if time.monotonic() >= check:
                    check = time.monotonic() + KILLED_POLL_S
                    for key, (_, _, pid) in list(self._watched.items()):
                        if killed(pid):
                            gone.append(self._drop(key))
            for call in gone:
                try:
                    call()
                except Exception:       # a caller's own failure: nothing above to raise to
                    log.exception("a request whose caller is gone could not be given up")
