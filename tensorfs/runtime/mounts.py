"""The mount table: what is mounted where (``/proc/self/mountinfo``), the tensorfs mounts
of a user, and the names a mount is known by (a resolved path, or ``/dev/fd/N``: a /dev/fuse
descriptor another process mounted)."""

from __future__ import annotations

import os
import re


def descriptor_of(mountpoint: str) -> int | None:
    """N when ``mountpoint`` is ``/dev/fd/N``: a /dev/fuse descriptor a privileged mounter
    opened and mounted, handed to this process (libfuse 3.3 and later serve it as is)."""
    match = re.fullmatch(r"/dev/fd/(\d+)", mountpoint)
    return int(match.group(1)) if match else None


def real_mountpoint(mountpoint: str) -> str:
    """The path a mount is known by: resolved, but ``/dev/fd/N`` as it is (resolved, it is
    /dev/fuse, whichever mount the descriptor belongs to)."""
    return mountpoint if descriptor_of(mountpoint) is not None else os.path.realpath(mountpoint)


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


def tensorfs_mounts(uid: int | None = None) -> list[str]:
    """Mount points of the tensorfs mounts (type fuse.tensorfs) that ``uid`` made (the
    kernel's user_id of a FUSE mount), in mount order; every user's when ``uid`` is None."""
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, tail = left.split(), right.split()
                if len(fields) < 5 or len(tail) < 3 or tail[0] != "fuse.tensorfs":
                    continue
                options = dict(o.partition("=")[::2] for o in tail[2].split(","))
                if uid is None or options.get("user_id") == str(uid):
                    found.append(_unescape_mountinfo(fields[4]))
    except OSError:
        return []
    return found
