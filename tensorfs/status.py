"""A mount's status file (SPEC §10): what ``tensorfs list`` shows of each live mount, owned
here and nowhere else.

The serving process publishes it once the mount answers (``publish``: mount point, source,
pid, tensor count, log, state "serving"), any source of that process may change its state
(``report``: "source changed" with the reason its log holds; a local file changed or
replaced under the mount, a remote object whose version changed), and the process withdraws
it when it stops serving (``withdraw``).  ``list`` reads it (``read``), ``unmount`` forgets
the one a killed daemon left (``forget``).  ``report`` is a no-op in a process that serves
no mount (``inspect``, the library), so any layer may call it.

The file is ``NAME.json`` in the runtime directory (``tensorfs.runtime``: written whole,
never through a symlink), JSON with ASCII escapes: a name from the model cannot break a
line of ``list``.
"""

from __future__ import annotations

import json
import logging
import os
import threading

from tensorfs import runtime

log = logging.getLogger("tensorfs")

SERVING = "serving"
SOURCE_CHANGED = "source changed"
SUFFIX = ".json"

_lock = threading.Lock()
_mine: dict | None = None        # this process's published status, while it serves


def _name(mountpoint: str) -> str:
    return os.path.basename(runtime.status_file(mountpoint))


def _encoded(status: dict) -> bytes:
    return json.dumps(status, ensure_ascii=True).encode() + b"\n"


def _write(name: str, status: dict) -> None:
    path, dir_fd = runtime.open_runtime_dir()
    try:
        runtime.write_file(dir_fd, name, _encoded(status))
    except OSError as error:
        raise runtime.RuntimeDirError(f"{os.path.join(path, name)}: cannot write: "
                                      f"{error.strerror}") from None
    finally:
        os.close(dir_fd)


def publish(mountpoint: str, info: dict) -> None:
    """This process serves ``mountpoint`` now: its status file says so.  A failure to write
    it is logged (the mount serves on; ``list`` will not show it)."""
    global _mine
    status = {"mountpoint": mountpoint, **info, "pid": os.getpid(), "state": SERVING,
              "reason": None}
    name = _name(mountpoint)
    with _lock:
        _mine = {"name": name, "status": status}
        try:
            _write(name, status)
        except runtime.RuntimeDirError as error:
            log.warning("%s (tensorfs list will not show this mount)", error)


def report(state: str, reason: str | None = None) -> None:
    """This process's mount is now in ``state`` ("source changed", with the reason)."""
    with _lock:
        if _mine is None:
            return
        _mine["status"] = {**_mine["status"], "state": state, "reason": reason}
        try:
            _write(_mine["name"], _mine["status"])
        except runtime.RuntimeDirError as error:
            log.warning("%s", error)


def withdraw() -> None:
    """This process no longer serves: its status file goes (not a later daemon's at the
    same mount point)."""
    global _mine
    with _lock:
        mine, _mine = _mine, None
    if mine is None:
        return
    path = os.path.join(runtime.runtime_dir(), mine["name"])
    if _pid_of(path) in (None, os.getpid()):
        _unlink(path)


def read(mountpoint: str, running=None) -> dict | None:
    """The status of ``mountpoint``'s live daemon (``running(pid)`` says which are alive),
    from whichever of the user's runtime directories holds it; else any status found."""
    found = []
    for path in runtime.find_files(mountpoint, SUFFIX):
        status = _load(path)
        if status is None:
            continue
        if running is not None and isinstance(status.get("pid"), int) and running(status["pid"]):
            return status
        found.append(status)
    return found[0] if found else None


def forget(mountpoint: str, live_pid: int | None = None) -> None:
    """Remove the status files of ``mountpoint`` that are not the live daemon's (a killed
    daemon could not withdraw its own)."""
    for path in runtime.find_files(mountpoint, SUFFIX):
        if live_pid is None or _pid_of(path) != live_pid:
            _unlink(path)


def _load(path: str) -> dict | None:
    try:
        status = json.loads(runtime.read_file(path) or b"null")
    except ValueError:
        return None
    return status if isinstance(status, dict) else None


def _pid_of(path: str) -> int | None:
    pid = (_load(path) or {}).get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
