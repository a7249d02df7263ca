"""Where a mount's daemon leaves its pid file and log, and how to tell what is mounted."""

from __future__ import annotations

import hashlib
import os


def runtime_dir() -> str:
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.access(base, os.W_OK):
        path = os.path.join(base, "tensorfs")
    elif os.geteuid() == 0 and os.access("/run", os.W_OK):
        path = "/run/tensorfs"
    else:
        path = f"/tmp/tensorfs-{os.getuid()}"
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _stem(mountpoint: str) -> str:
    real = os.path.realpath(mountpoint)
    readable = "".join(c if c.isalnum() else "_" for c in real.strip("/"))[-60:]
    return f"{readable}-{hashlib.sha256(real.encode('utf-8', 'surrogateescape')).hexdigest()[:12]}"


def pid_file(mountpoint: str) -> str:
    return os.path.join(runtime_dir(), _stem(mountpoint) + ".pid")


def default_log_file(mountpoint: str) -> str:
    return os.path.join(runtime_dir(), _stem(mountpoint) + ".log")


def _unescape_mountinfo(field: str) -> str:
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mountinfo(real: str) -> tuple[str, str] | None:
    """(device "major:minor", filesystem type) of what is mounted exactly at the resolved
    path ``real``.

    Read from /proc/self/mountinfo, which also lists a FUSE mount whose daemon died (a stat
    of it fails with ENOTCONN, so os.path.ismount cannot see it).  The last mount wins.
    """
    found = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) >= 5 and _unescape_mountinfo(fields[4]) == real:
                    found = fields[2], right.split()[0] if right else "unknown"
    except OSError:
        return None
    return found


def mount_type(mountpoint: str) -> str | None:
    """The filesystem type mounted exactly at ``mountpoint`` ("fuse.tensorfs" ...), or None."""
    found = _mountinfo(os.path.realpath(mountpoint))
    return found[1] if found else None


def mount_device(real_mountpoint: str) -> str | None:
    """The device ("0:54") of the mount at ``real_mountpoint``: its /sys/class/bdi entry's
    name.  The path must be resolved already: resolving it would stat the mount, and a
    single-threaded daemon asking about its own mount waits for itself."""
    found = _mountinfo(real_mountpoint)
    return found[0] if found else None
