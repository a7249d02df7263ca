"""A mount's status file (docs/reference/cli.md): what ``tensorfs list`` shows of each live mount, owned
here and nowhere else.

The serving process publishes it once the mount answers (``publish``: mount point, source,
pid, tensor count, log, state "serving"), any source of that process may change its state
(``report``: "source changed" with the reason its log holds; a local file changed or
replaced under the mount, a remote object whose version changed), a remote source whose
reads fail makes it "degraded" with the reason (``read_failed``) until its requests are
answered again (``read_ok``), and the process withdraws it when it stops serving
(``withdraw``).  ``list`` reads it (``read``) and takes its rows from here (``listing``:
the file that changed by its name in the mount and what still reads, that last failure, and
the ``/dev/fd/N`` mounts, one row per daemon); ``unmount`` forgets the one a killed daemon left (``forget``).
``report`` is a no-op in a process that serves no mount (``inspect``, the library), so any layer may call it.

The file is ``NAME.json`` in the runtime directory (``tensorfs.runtime.files``: NAME is
unique per live mount, the serving pid's in a ``/dev/fd/N`` mount's; written whole,
never through a symlink), JSON with ASCII escapes: a name from the model cannot break a
line of ``list``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time

from tensorfs.errors import plural
from tensorfs.runtime import files as runtime
from tensorfs.runtime.mounts import descriptor_of

log = logging.getLogger("tensorfs")

SERVING = "serving"
DEGRADED = "degraded"
SOURCE_CHANGED = "source changed"
SUFFIX = ".json"

_lock = threading.Lock()
_mine: dict | None = None        # this process's published status, while it serves
_degraded = False                # some source's reads fail now (read_ok's quick test)


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


def publish(mountpoint: str, info: dict, files: dict | None = None) -> None:
    """This process serves ``mountpoint`` now: its status file says so.  A failure to write
    it is logged (the mount serves on; ``list`` will not show it).  ``files``: each file
    the mount serves whole, by its source's path: ``{"name": "files/NAME", "tensors": N}``,
    so that a report about one says which file it is and what still reads; kept here, not
    written (``info["files"]`` is taken for it too)."""
    global _mine
    info = dict(info)
    files = info.pop("files", None) or files      # the caller's info may carry them
    status = {"mountpoint": mountpoint, **info, "pid": os.getpid(), "state": SERVING,
              "reason": None}
    name = _name(mountpoint)
    with _lock:
        _mine = {"name": name, "status": status, "files": dict(files or {}), "written": 0.0,
                 "failing": set()}
        try:
            _write(name, status)
        except runtime.RuntimeDirError as error:
            log.warning("%s (tensorfs list will not show this mount)", error)


def report(state: str, reason: str | None = None) -> None:
    """This process's mount is now in ``state`` ("source changed", with the reason: the
    source's path, ": ", what happened).  Each distinct reason is kept, said with the file's
    name in the mount and what still reads."""
    with _lock:
        if _mine is None:
            return
        said = explained(reason, _mine["files"], _mine["status"].get("tensors")) \
            if reason else None
        problems = list(_mine["status"].get("problems") or [])
        if said is not None and said not in problems:
            problems.append(said)
        _mine["status"] = {**_mine["status"], "state": state,
                           "reason": "; ".join(problems) or None, "problems": problems}
        _flush()


def read_failed(path: str, message: str) -> None:
    """A read of ``path`` (a source's path) failed for a reason other than a change (a
    server gone, a 503, the file gone): the mount is "degraded", the reason naming the file
    and what happened, and ``list`` shows the last failure and when.  Written at once when
    the state or the message changes, else at most once a second: every read of a dead
    server fails."""
    global _degraded
    with _lock:
        if _mine is None:
            return
        entry = _mine["files"].get(path)
        what = f"{entry['name']}: {message}" if entry and len(_mine["files"]) > 1 else message
        status = _mine["status"]
        last = status.get("last_failure") or {}
        now = time.time()
        changed = status.get("state") == SERVING
        status = {**status, "last_failure": {"what": what, "at": now}}
        if status.get("state") in (SERVING, DEGRADED):      # a source changed says more
            status.update(state=DEGRADED, reason=what)
            _mine["failing"].add(path)
            _degraded = True
        _mine["status"] = status
        if changed or last.get("what") != what or now - _mine["written"] >= 1.0:
            _flush()


def read_ok(path: str) -> None:
    """A request for ``path`` (a source's path) was answered: if its reads were what made
    the mount degraded, and no other file's still are, it is serving again (the last
    failure stays shown, with its time).  Free while nothing failed: called on every
    fetch."""
    global _degraded
    if not _degraded:
        return
    with _lock:
        if _mine is None or path not in _mine["failing"]:
            return
        _mine["failing"].discard(path)
        if _mine["failing"] or _mine["status"].get("state") != DEGRADED:
            return
        _degraded = False
        _mine["status"] = {**_mine["status"], "state": SERVING, "reason": None}
        _flush()


def _flush() -> None:
    """Write this process's status (the lock held)."""
    _mine["written"] = time.time()
    try:
        _write(_mine["name"], _mine["status"])
    except runtime.RuntimeDirError as error:
        log.warning("%s", error)


def explained(reason: str, files: dict, total: int | None) -> str:
    """A source's report as ``list`` says it: the file by its name in the mount, and what
    still reads (``/m/config.json (files/config.json) changed: rewritten in place …; it
    reads EIO, the tensors serve``).  A reason about no known file is kept as it is."""
    path = next((p for p in sorted(files, key=len, reverse=True)
                 if reason.startswith(p + ": ")), None)
    if path is None:
        return reason
    name, count = files[path]["name"], files[path].get("tensors", 0)
    rest = reason[len(path) + 2:]
    if "EIO" not in rest:                         # still served as it was at mount time
        return f"{path} ({name}): {rest}"
    cause = re.split(r"[:;] every read", rest)[0]
    cause = re.sub(r"^the model file (was|is) ", "", cause)
    if not count:
        then = "it reads EIO, the tensors serve"
    elif total is not None and count >= total:
        then = "it and every tensor read EIO"
    else:
        serving = total - count if total else 0
        others = f", the other {plural(serving, 'tensor')} serve{'s' if serving == 1 else ''}" \
            if serving else ""
        then = f"it and its {plural(count, 'tensor')} read EIO{others}"
    return f"{path} ({name}) changed: {cause}; {then}"


def shown_state(status: dict) -> str:
    """The STATE column of ``list``: the state, its reasons, and a URL's last failed read
    with its local time (``degraded: cannot connect … (12:03:04)``; ``serving, last read
    failed: … (12:03:04)`` once reads work again)."""
    state = status.get("state") or "unknown"
    if status.get("reason"):
        state += f": {status['reason']}"
    failure = status.get("last_failure")
    if isinstance(failure, dict) and failure.get("what"):
        at = failure.get("at")
        when = f" ({time.strftime('%H:%M:%S', time.localtime(at))})" \
            if isinstance(at, (int, float)) else ""
        if status.get("state") == DEGRADED and failure["what"] == status.get("reason"):
            state += when
        else:
            state += f"{';' if status.get('reason') else ','} last read failed: " \
                     f"{failure['what']}{when}"
    return state


def listing(mountpoints: list[str], pid_of, running) -> list[dict]:
    """One row per mount for ``tensorfs list``: each of ``mountpoints`` (the user's tensorfs
    mounts in the mount table), then each ``/dev/fd/N`` mount (mounted by another process,
    so in no mount table under that name) whose daemon runs, one row per daemon: any
    number of them may serve a ``/dev/fd/9``."""
    rows = []
    by_descriptor = _descriptor_mounts(running)
    for mountpoint in mountpoints:
        status = read(mountpoint, running) or {}
        pid = pid_of(mountpoint)
        if pid is None and status:
            status = {**status, "state": "daemon gone",
                      "reason": "the daemon exited: tensorfs unmount it", "last_failure": None}
        elif pid is None or status.get("pid") != pid:
            status = {"state": "unknown", "reason": "no status in this user's runtime directory"
                      + (" (served through a descriptor? see the /dev/fd/N rows)"
                         if by_descriptor else "")}
        rows.append(_row(mountpoint, status, pid))
    for status in by_descriptor:
        rows.append(_row(status["mountpoint"], status, status["pid"]))
    return rows


def _row(mountpoint: str, status: dict, pid: int | None) -> dict:
    return {"mountpoint": mountpoint, "source": status.get("source"), "pid": pid,
            "tensors": status.get("tensors"), "state": status.get("state"),
            "reason": status.get("reason"), "last_failure": status.get("last_failure"),
            "shown": shown_state(status), "log": status.get("log"),
            "gguf": status.get("gguf") or [], "gguf_note": status.get("gguf_note")}


def _descriptor_mounts(running) -> list[dict]:
    """The status of each live ``/dev/fd/N`` mount, in the order of their files' names."""
    found, pids = [], set()
    for directory in runtime.known_dirs():
        try:
            names = sorted(n for n in os.listdir(directory) if n.endswith(SUFFIX))
        except OSError:
            continue
        for name in names:
            if not name.startswith("dev_fd_"):
                continue
            status = _load(os.path.join(directory, name)) or {}
            mountpoint, pid = status.get("mountpoint"), status.get("pid")
            if isinstance(mountpoint, str) and descriptor_of(mountpoint) is not None \
                    and type(pid) is int and running(pid) and pid not in pids:
                pids.add(pid)
                found.append(status)
    return found


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
