"""``-o`` options: which a user may give, checked before anything is mounted.

A tensorfs mount is read-only by contract, so its option list is an allow-list: an option
not named here is refused with one line naming it, and so is a value that is not what the
option takes.  What is refused and why (docs/cli.md has the same table):

- ``rw``: the mount is read-only; a read-write mount would answer writes with ENOSYS
  instead of the kernel refusing them with EROFS.
- ``subtype``, ``fsname`` with odd characters, ``user_id``, ``group_id``, ``fd``,
  ``rootmode``, ``blkdev`` ...: tensorfs sets these itself (``tensorfs list`` and
  ``unmount`` know a mount by its type ``fuse.tensorfs``).
- any value holding a comma, a backslash, whitespace or a control character: libfuse
  splits options at commas and unescapes backslashes, so such a value would smuggle in a
  second option.

``dev``, ``suid`` (which mount.fuse3 adds unless told ``nodev``/``nosuid``) are accepted
and have no effect: every tensorfs mount is ``nodev,nosuid`` (no file in it is a device or
setuid).  ``rw`` coming from mount(8) through the fstab convention is its default, not a
request: ``parse(..., from_mount_helper=True)`` drops it, with the userspace-only options
(``nofail``, ``_netdev``, ``x-*`` ...).
"""

from __future__ import annotations

import re

_FLAGS = {
    "allow_other": "other users may read the mount (non-root: user_allow_other in /etc/fuse.conf)",
    "allow_root": "root may read the mount too",
    "default_permissions": "the kernel checks the 0444/0555 modes (always on)",
    "ro": "read-only (always on)",
    "nodev": "always on", "nosuid": "always on",
    "dev": "accepted for mount.fuse3; nodev stays", "suid": "accepted for mount.fuse3; nosuid stays",
    "exec": "files have no x bit either way", "noexec": "passed on",
    "atime": "passed on", "noatime": "passed on",
    "nothreads": "one thread serves (tensorfs.fusefs)",
    "kernel_cache": "always in effect", "use_ino": "always in effect",
    "auto_unmount": "fusermount unmounts if the daemon dies",
}
_NUMBERS = {"attr_timeout": float, "entry_timeout": float, "negative_timeout": float,
            "max_read": int}
_FSNAME = re.compile(r"[A-Za-z0-9._:@/+-]{1,200}")
_BAD_VALUE = re.compile(r"[\\,\s\x00-\x1f\x7f-\x9f]")
_TENSORFS_OWN = {"subtype", "user_id", "group_id", "fd", "rootmode", "blkdev", "blksize",
                 "fsname"}
_IGNORED_BY_MOUNT = {"dev", "suid"}     # nodev,nosuid are always given


class OptionError(ValueError):
    """A refused ``-o`` option: ``str()`` is one line naming it."""


def parse(texts: list[str], *, from_mount_helper: bool = False) -> dict:
    """The user's ``-o`` arguments as ``{option: value or True}``, every one checked.
    ``from_mount_helper``: called the fuse(8) way, where mount(8) adds ``rw`` and mount.fuse3
    adds ``dev,suid`` by default and userspace-only options (``x-systemd.*``) may pass."""
    options: dict = {}
    for text in texts:
        for item in text.split(","):
            item = item.strip()
            if not item:
                continue
            key, sep, value = item.partition("=")
            shown = escape_option(item)
            if from_mount_helper and (key == "rw" and not sep or key.startswith("x-")
                                      or key in ("defaults", "_netdev", "nofail", "noauto",
                                                 "auto", "user", "users", "nouser")):
                continue
            if _BAD_VALUE.search(key) or (sep and _BAD_VALUE.search(value)):
                raise OptionError(f"-o {shown}: a backslash, comma, space or control character "
                                  "is not allowed in an option")
            if key == "rw":
                raise OptionError("-o rw: not allowed: a tensorfs mount is read-only")
            if key == "fsname" and sep:
                if not _FSNAME.fullmatch(value):
                    raise OptionError(f"-o {shown}: fsname may hold letters, digits and ._:@/+- only")
                options[key] = value
                continue
            if key in _NUMBERS:
                kind = _NUMBERS[key]
                try:
                    number = kind(value) if sep else None
                except ValueError:
                    number = None
                if number is None or number < 0 or number != number or number == float("inf") \
                        or (key == "max_read" and number == 0):
                    what = "a whole number of bytes above 0" if kind is int else \
                        "a number of seconds, 0 or more"
                    raise OptionError(f"-o {shown}: {key} takes {what}")
                options[key] = value
                continue
            if key in _FLAGS:
                if sep:
                    raise OptionError(f"-o {shown}: {key} takes no value")
                if key not in _IGNORED_BY_MOUNT:
                    options[key] = True
                continue
            if key in _TENSORFS_OWN:
                raise OptionError(f"-o {shown}: not allowed: tensorfs sets {key} itself")
            raise OptionError(f"-o {shown}: unknown or not allowed option (allowed: "
                              f"{', '.join(sorted([*_FLAGS, *_NUMBERS, 'fsname']))})")
    return options


def escape_option(text: str) -> str:
    from tensorfs.errors import printable

    return printable(text)
