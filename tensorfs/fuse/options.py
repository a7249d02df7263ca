"""``-o`` options: which a user may give, checked before anything is mounted.

A tensorfs mount is read-only by contract, so its option list is an allow-list: an option
not named here is refused with one line naming it, and so is a value that is not what the
option takes.  What is refused and why (docs/reference/cli.md has the same table):

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
setuid).  ``atime`` is answered here, not passed on: it only undoes ``noatime`` (the kernel's
default is what it asks for), and libfuse 3.17 on no longer knows it.

The options are parsed once, into one ``MountOptions``: the CLI makes it, the FUSE adapter
(``tensorfs.mount.adapter``) takes the timeouts and the thread count from it and the binding
(``tensorfs.fuse.session``) the ``max_read`` it must repeat at INIT and the ``-o`` list libfuse
gets (``libfuse_options``), which holds only what every supported libfuse (3.10 to 3.18)
accepts: tests/fuse/test_libfuse_matrix.py mounts every allowed option on each.  ``rw`` coming
from mount(8) through the fstab convention is its default, not a request:
``parse(..., from_mount_helper=True)`` drops it, with the userspace-only options
(``nofail``, ``_netdev``, ``x-*`` ...).
"""

from __future__ import annotations

import dataclasses
import re

from tensorfs.errors import printable

DAY_S = 86400.0         # the model is immutable: attributes, names and misses keep a day

_FLAGS = {
    "allow_other": "other users may read the mount (non-root: user_allow_other in /etc/fuse.conf)",
    "allow_root": "root may read the mount too",
    "default_permissions": "the kernel checks the modes, no more than the model grants (always on)",
    "ro": "read-only (always on)",
    "nodev": "always on", "nosuid": "always on",
    "dev": "accepted for mount.fuse3; nodev stays", "suid": "accepted for mount.fuse3; nosuid stays",
    "exec": "files have no x bit either way", "noexec": "passed on",
    "atime": "undoes noatime (answered here: libfuse 3.17 on refuses it)", "noatime": "passed on",
    "nothreads": "one thread serves (tensorfs.mount.adapter)",
    "kernel_cache": "always in effect", "use_ino": "always in effect",
    "auto_unmount": "fusermount unmounts if the daemon dies",
}
_NUMBERS = ("attr_timeout", "entry_timeout", "negative_timeout", "max_read")
MAX_READ_LIMIT = 2**32 - 1      # libfuse reads it with %u, the kernel keeps a u32
_WHOLE = re.compile(r"[0-9]{1,10}")
_FSNAME = re.compile(r"[A-Za-z0-9._:@/+-]{1,200}")
_BAD_VALUE = re.compile(r"[\\,\s\x00-\x1f\x7f-\x9f]")
_TENSORFS_OWN = {"subtype", "user_id", "group_id", "fd", "rootmode", "blkdev", "blksize",
                 "fsname"}
_MOUNT_HELPER_ONLY = ("defaults", "_netdev", "nofail", "noauto", "auto", "user", "users",
                      "nouser")
# one value of each allowed option, for the tests that mount every one of them
EXAMPLES = ("allow_other", "allow_root", "default_permissions", "ro", "nodev", "nosuid", "dev",
            "suid", "exec", "noexec", "atime", "noatime", "nothreads", "kernel_cache",
            "use_ino", "auto_unmount", "attr_timeout=0.5", "entry_timeout=0",
            "negative_timeout=0", "max_read=65536", "fsname=my-model")


class OptionError(ValueError):
    """A refused ``-o`` option: ``str()`` is one line naming it."""


@dataclasses.dataclass(frozen=True)
class MountOptions:
    """Every ``-o`` of one mount, checked, with tensorfs's defaults."""

    fsname: str = "tensorfs"
    allow_other: bool = False
    allow_root: bool = False
    noexec: bool = False
    noatime: bool = False
    auto_unmount: bool = False
    threads: bool = True
    max_read: int = 0           # 0: none given (libfuse's own default)
    attr_timeout: float = DAY_S
    entry_timeout: float = DAY_S
    negative_timeout: float = DAY_S
    editable: bool = False      # --edits (not an -o option): the mount is not read-only

    def libfuse_options(self) -> list[str]:
        """The ``-o`` list libfuse gets: read-only, no devices or setuid, the kernel checking
        the modes, and the type ``fuse.tensorfs`` (how ``list`` and ``unmount`` know a
        mount) whatever the user gave; then what they asked for."""
        out = ["ro", "nodev", "nosuid", "default_permissions", f"fsname={self.fsname}",
               "subtype=tensorfs"]
        if self.editable:
            out.remove("ro")
        out += [name for name in ("allow_other", "allow_root", "noexec", "noatime",
                                  "auto_unmount") if getattr(self, name)]
        if self.max_read:
            out.append(f"max_read={self.max_read}")
        return out


def parse(texts: list[str], *, from_mount_helper: bool = False,
          fsname: str = "tensorfs") -> MountOptions:
    """The user's ``-o`` arguments as one ``MountOptions``, every one checked; ``fsname``
    is the default name.  ``from_mount_helper``: called the fuse(8) way, where mount(8) adds
    ``rw`` and mount.fuse3 adds ``dev,suid`` by default and userspace-only options
    (``x-systemd.*``) may pass.  Of two that contradict (``exec,noexec``), the last counts."""
    chosen: dict = {"fsname": fsname}
    for text in texts:
        for item in text.split(","):
            item = item.strip()
            if not item:
                continue
            key, sep, value = item.partition("=")
            shown = escape_option(item)
            if from_mount_helper and (key == "rw" and not sep or key.startswith("x-")
                                      or key in _MOUNT_HELPER_ONLY):
                continue
            if _BAD_VALUE.search(key) or (sep and _BAD_VALUE.search(value)):
                raise OptionError(f"-o {shown}: a backslash, comma, space or control character "
                                  "is not allowed in an option")
            if key == "rw":
                raise OptionError("-o rw: not allowed: a tensorfs mount is read-only")
            if key == "fsname" and sep:
                if not _FSNAME.fullmatch(value):
                    raise OptionError(f"-o {shown}: fsname may hold letters, digits and ._:@/+- only")
                chosen[key] = value
            elif key in _NUMBERS:
                chosen[key] = _number(key, value if sep else None, shown)
            elif key in _FLAGS:
                if sep:
                    raise OptionError(f"-o {shown}: {key} takes no value")
                _flag(chosen, key)
            elif key in _TENSORFS_OWN:
                raise OptionError(f"-o {shown}: not allowed: tensorfs sets {key} itself")
            else:
                raise OptionError(f"-o {shown}: unknown or not allowed option (allowed: "
                                  f"{', '.join(sorted([*_FLAGS, *_NUMBERS, 'fsname']))})")
    return MountOptions(**chosen)


def _flag(chosen: dict, key: str) -> None:
    if key in ("allow_other", "allow_root", "noexec", "noatime", "auto_unmount"):
        chosen[key] = True
    elif key in ("exec", "atime"):
        chosen["no" + key] = False
    elif key == "nothreads":
        chosen["threads"] = False
    # the rest is always in effect (ro, nodev, nosuid, default_permissions, kernel_cache,
    # use_ino) or without effect (dev, suid: nodev,nosuid stay)


def _number(key: str, text: str | None, shown: str):
    """``max_read``: whole bytes from 1 to ``MAX_READ_LIMIT`` (the one rule: the binding
    repeats it at INIT); a timeout: seconds, a finite number, 0 or more."""
    if key == "max_read":
        if text is not None and _WHOLE.fullmatch(text) and 0 < int(text) <= MAX_READ_LIMIT:
            return int(text)
        raise OptionError(f"-o {shown}: max_read takes a whole number of bytes from 1 to "
                          f"{MAX_READ_LIMIT}")
    try:
        seconds = float(text) if text is not None and text.strip() else None
    except ValueError:
        seconds = None
    if seconds is None or not 0 <= seconds < float("inf"):      # NaN fails both
        raise OptionError(f"-o {shown}: {key} takes a number of seconds, 0 or more")
    return seconds


def escape_option(text: str) -> str:
    return printable(text)
