"""A ctypes binding to libfuse 3's low-level API: the calls a read-only tree of byte sources
needs, and nothing about what the tree holds.

Why not fusepy: it binds libfuse 2's path-based API, which caps reads at 128 KiB, cannot
answer ``READDIRPLUS`` and turns every ``opendir`` into a round trip.  The low-level API is
inode-based and lets this module

- answer ``opendir`` and ``open`` with ``ENOSYS`` once: from then on the kernel opens files
  and directories by itself, keeps their pages (``FOPEN_KEEP_CACHE``) and caches directory
  listings (``FOPEN_CACHE_DIR``), so a second ``find`` never reaches the daemon;
- answer ``READDIRPLUS`` with every entry's attributes, so walking a tree needs no
  ``LOOKUP`` per directory;
- take reads of up to 1 MiB (libfuse 3 negotiates ``FUSE_MAX_PAGES``).

docs/serving.md has the measurements.  The filesystem object given to ``Session`` answers
in plain Python values (``Entry`` tuples, bytes, counts) and raises ``FsError(errno)`` for a
deliberate answer; ``errno_of`` (also given) turns any other exception into an errno, so
the mapping of errors lives with the filesystem, not here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import platform
import signal
import stat
import threading
import time
from typing import NamedTuple

from tensorfs.mount.options import MountOptions
from tensorfs.runtime import descriptor_of, mount_device

log = logging.getLogger("tensorfs")

ROOT_INO = 1
# Capability bits (fuse_common.h, the same in every libfuse 3).
FUSE_CAP_SPLICE_WRITE = 1 << 7
FUSE_CAP_READDIRPLUS_AUTO = 1 << 14
FUSE_CAP_PASSTHROUGH = 1 << 29          # 3.17 on (Linux 6.9 on)
FUSE_CAP_PARALLEL_DIROPS = 1 << 18      # fuse_common.h: lookups in one directory at once
# struct fuse_buf's flags (enum fuse_buf_flags)
FUSE_BUF_IS_FD = 1 << 1
FUSE_BUF_FD_SEEK = 1 << 2
# struct fuse_file_info's bit fields, in the one 32-bit word after ``flags`` (GCC allocates
# bit fields from the least significant bit on little-endian machines;
# tests/test_struct_layout.py checks it)
FI_KEEP_CACHE = 1 << 2
FI_NOFLUSH = 1 << 7                     # 3.12 on; padding (ignored) before
# fuse_conn_info.max_backing_stack_depth: FUSE_BACKING_STACKED_OVER, so that a model on a
# stacked filesystem (overlayfs: a container's root) can be a backing file too; the cost is
# that this mount cannot itself be stacked under another overlay.
BACKING_STACKED_OVER = 1

# An edit's reply waits this long, at most, for the kernel to forget what the edit changed
# (Session.invalidate).
INVALIDATE_WAIT_S = 2.0

# How the bytes of a local file reach the kernel (``Session.mechanism``, logged once).
PASSTHROUGH, SPLICE, COPY = "passthrough", "splice", "copy"


class FuseUnavailable(RuntimeError):
    """libfuse 3 is missing or refused the mount: said in one line by the CLI."""


class FsError(OSError):
    """A deliberate answer (ENOENT, ENOTDIR, ENODATA ...), sent as it is."""

    def __init__(self, code: int):
        super().__init__(code, os.strerror(code))


class Entry(NamedTuple):
    """What ``stat`` says of one node.  The rest (owner, times, block size) is the same for
    every node of a mount and given to ``Session``.  In a listing, ``size`` None means "not
    known without work": that entry goes without attributes and the kernel looks it up.
    ``mtime_ns``: the node's own mtime (a file of files/), else the mount's; ``owner``:
    the node's own (mode bits, uid, gid) (a local file of files/), else the mount's."""
    ino: int
    is_dir: bool
    size: int | None
    nlink: int
    mtime_ns: int | None = None
    owner: tuple[int, int, int] | None = None
    writable: bool = False          # an editable mount's file or directory: the owner may write


# -- the C structures (Linux x86_64 and aarch64; tests/test_struct_layout.py compares each
# size and offset with what the C compiler says for the installed headers) -----------------

class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _StatX86_64(ctypes.Structure):
    _fields_ = [("st_dev", ctypes.c_uint64), ("st_ino", ctypes.c_uint64),
                ("st_nlink", ctypes.c_uint64), ("st_mode", ctypes.c_uint32),
                ("st_uid", ctypes.c_uint32), ("st_gid", ctypes.c_uint32),
                ("_pad0", ctypes.c_int32), ("st_rdev", ctypes.c_uint64),
                ("st_size", ctypes.c_int64), ("st_blksize", ctypes.c_int64),
                ("st_blocks", ctypes.c_int64), ("st_atim", Timespec),
                ("st_mtim", Timespec), ("st_ctim", Timespec),
                ("_reserved", ctypes.c_int64 * 3)]


class _StatGeneric64(ctypes.Structure):     # the kernel's asm-generic layout (aarch64)
    _fields_ = [("st_dev", ctypes.c_uint64), ("st_ino", ctypes.c_uint64),
                ("st_mode", ctypes.c_uint32), ("st_nlink", ctypes.c_uint32),
                ("st_uid", ctypes.c_uint32), ("st_gid", ctypes.c_uint32),
                ("st_rdev", ctypes.c_uint64), ("_pad1", ctypes.c_uint64),
                ("st_size", ctypes.c_int64), ("st_blksize", ctypes.c_int32),
                ("_pad2", ctypes.c_int32), ("st_blocks", ctypes.c_int64),
                ("st_atim", Timespec), ("st_mtim", Timespec), ("st_ctim", Timespec),
                ("_reserved", ctypes.c_int32 * 2)]


# struct stat is the C library's, so it is chosen by system and machine together: macOS on
# arm64 is not Linux on aarch64.  Only Linux is served at all (_load says why).
STAT_LAYOUTS = {("Linux", "x86_64"): _StatX86_64, ("Linux", "aarch64"): _StatGeneric64}
Stat = STAT_LAYOUTS.get((platform.system(), platform.machine()))


class EntryParam(ctypes.Structure):
    _fields_ = [("ino", ctypes.c_uint64), ("generation", ctypes.c_uint64), ("attr", Stat or ctypes.c_char),
                ("attr_timeout", ctypes.c_double), ("entry_timeout", ctypes.c_double)]


class Statvfs(ctypes.Structure):
    _fields_ = [("f_bsize", ctypes.c_ulong), ("f_frsize", ctypes.c_ulong),
                ("f_blocks", ctypes.c_uint64), ("f_bfree", ctypes.c_uint64),
                ("f_bavail", ctypes.c_uint64), ("f_files", ctypes.c_uint64),
                ("f_ffree", ctypes.c_uint64), ("f_favail", ctypes.c_uint64),
                ("f_fsid", ctypes.c_ulong), ("f_flag", ctypes.c_ulong),
                ("f_namemax", ctypes.c_ulong), ("_spare", ctypes.c_int * 6)]


class ConnInfo(ctypes.Structure):
    """struct fuse_conn_info: 128 bytes in every libfuse 3, each version giving more of the
    reserved tail a meaning: 3.17 ``capable_ext`` and ``want_ext`` (64-bit flags replacing
    ``capable`` and ``want``), 3.18 ``request_timeout``.  Before 3.17 the bytes declared here
    as those fields are reserved, and never touched."""
    _fields_ = [("proto_major", ctypes.c_uint32), ("proto_minor", ctypes.c_uint32),
                ("max_write", ctypes.c_uint32), ("max_read", ctypes.c_uint32),
                ("max_readahead", ctypes.c_uint32), ("capable", ctypes.c_uint32),
                ("want", ctypes.c_uint32), ("max_background", ctypes.c_uint32),
                ("congestion_threshold", ctypes.c_uint32), ("time_gran", ctypes.c_uint32),
                ("max_backing_stack_depth", ctypes.c_uint32),     # 3.17 on
                ("_flag_bits", ctypes.c_uint32),                   # no_interrupt:1, padding:31
                ("capable_ext", ctypes.c_uint64), ("want_ext", ctypes.c_uint64),
                ("_tail", ctypes.c_uint8 * 64)]      # reserved; 3.18 took request_timeout


class FileInfo(ctypes.Structure):
    """struct fuse_file_info: 40 bytes before 3.17, 64 from 3.17 on (``backing_id`` and the
    fields after it were the tail padding).  Only ``_bits`` (FI_*), ``fh`` and, from 3.17 on,
    ``backing_id`` are written."""
    _fields_ = [("flags", ctypes.c_int32), ("_bits", ctypes.c_uint32),
                ("_padding2", ctypes.c_uint32), ("_padding3", ctypes.c_uint32),
                ("fh", ctypes.c_uint64), ("lock_owner", ctypes.c_uint64),
                ("poll_events", ctypes.c_uint32),
                ("backing_id", ctypes.c_int32),                    # 3.17 on
                ("compat_flags", ctypes.c_uint64),                 # 3.17 on
                ("_reserved", ctypes.c_uint64 * 2)]


class FuseBuf(ctypes.Structure):
    """struct fuse_buf; ``mem_size`` from 3.17 on (libfuse reads it only for memory it
    allocated itself: zero here)."""
    _fields_ = [("size", ctypes.c_size_t), ("flags", ctypes.c_int), ("mem", ctypes.c_void_p),
                ("fd", ctypes.c_int), ("pos", ctypes.c_int64),
                ("mem_size", ctypes.c_size_t)]                     # 3.17 on


class FuseBufvec(ctypes.Structure):
    """struct fuse_bufvec with one buffer (``buf[1]`` in C)."""
    _fields_ = [("count", ctypes.c_size_t), ("idx", ctypes.c_size_t), ("off", ctypes.c_size_t),
                ("buf", FuseBuf * 1)]


class FuseCtx(ctypes.Structure):
    """struct fuse_ctx: who sent a request."""
    _fields_ = [("uid", ctypes.c_uint32), ("gid", ctypes.c_uint32), ("pid", ctypes.c_int32),
                ("umask", ctypes.c_uint32)]


# fuse_lowlevel.h: which attributes a SETATTR sets
FUSE_SET_ATTR_MODE, FUSE_SET_ATTR_UID, FUSE_SET_ATTR_GID, FUSE_SET_ATTR_SIZE = 1, 2, 4, 8


class FuseArgs(ctypes.Structure):
    _fields_ = [("argc", ctypes.c_int), ("argv", ctypes.POINTER(ctypes.c_char_p)),
                ("allocated", ctypes.c_int)]


# struct fuse_lowlevel_ops: function pointers in this order (fuse_lowlevel.h, 3.0 to 3.18;
# later versions only append: 3.18 added tmpfile and statx).  A slot left NULL is answered by libfuse itself.
OPS_SLOTS = ("init destroy lookup forget getattr setattr readlink mknod mkdir unlink rmdir "
             "symlink rename link open read write flush release fsync opendir readdir "
             "releasedir fsyncdir statfs setxattr getxattr listxattr removexattr access create "
             "getlk setlk bmap ioctl poll write_buf retrieve_reply forget_multi flock fallocate "
             "readdirplus copy_file_range lseek").split()

req_t, ino_t, fi_p = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p
CALLBACK_TYPES = {
    "init": ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ConnInfo)),
    "lookup": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_char_p),
    "getattr": ctypes.CFUNCTYPE(None, req_t, ino_t, fi_p),
    "open": ctypes.CFUNCTYPE(None, req_t, ino_t, fi_p),
    "opendir": ctypes.CFUNCTYPE(None, req_t, ino_t, fi_p),
    "read": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_size_t, ctypes.c_int64, fi_p),
    "readdir": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_size_t, ctypes.c_int64, fi_p),
    "readdirplus": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_size_t, ctypes.c_int64, fi_p),
    "statfs": ctypes.CFUNCTYPE(None, req_t, ino_t),
    "getxattr": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_char_p, ctypes.c_size_t),
    "listxattr": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_size_t),
    # an editable mount's (--edits): writes, new files, removals, renames
    "setattr": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_void_p, ctypes.c_int, fi_p),
    "unlink": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_char_p),
    "rmdir": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_char_p),
    "rename": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_char_p, ino_t, ctypes.c_char_p,
                               ctypes.c_uint),
    "write": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_void_p, ctypes.c_size_t,
                              ctypes.c_int64, fi_p),
    "flush": ctypes.CFUNCTYPE(None, req_t, ino_t, fi_p),
    "release": ctypes.CFUNCTYPE(None, req_t, ino_t, fi_p),
    "create": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_char_p, ctypes.c_uint32, fi_p),
    "setxattr": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_char_p, ctypes.c_void_p,
                                 ctypes.c_size_t, ctypes.c_int),
}


# libfuse 3.17 renamed the shared object (ABI 4); nothing the binding uses changed with it.
SONAMES = ("libfuse3.so.4", "libfuse3.so.3")

NOT_LINUX = ("tensorfs mounts on Linux only ({system} here): it needs libfuse 3 and Linux's "
             "FUSE protocol (READDIRPLUS, 1 MiB requests), which macFUSE and BSD lack")


def _candidates() -> list[str]:
    """Where to look, in the dynamic linker's order: LD_LIBRARY_PATH's directories first
    (either name), then the system's cache.  Asking dlopen for one name after the other would
    let the cache's libfuse3.so.3 win over an LD_LIBRARY_PATH holding only libfuse3.so.4."""
    found = []
    for directory in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        for name in SONAMES:
            path = os.path.join(directory, name)
            if directory and os.path.exists(path):
                found.append(path)
    return found + list(SONAMES)


def _load():
    if platform.system() != "Linux":
        raise FuseUnavailable(NOT_LINUX.format(system=platform.system()))
    if Stat is None:
        raise FuseUnavailable(f"no struct stat layout for {platform.machine()} "
                              f"(x86_64 and aarch64 only)")
    lib = None
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        raise FuseUnavailable("libfuse 3 not found (libfuse3.so.4 or libfuse3.so.3): "
                              "install Debian's fuse3 (apt-get install fuse3)")

    def fn(symbol, restype, *argtypes):
        f = getattr(lib, symbol)
        f.restype, f.argtypes = restype, list(argtypes)
        return f

    P, sz, i64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64
    lib.version = lib.fuse_version()                    # 317 for 3.17.x
    fn("fuse_pkgversion", ctypes.c_char_p)
    if hasattr(lib, "fuse_set_log_func"):                # 3.7 on
        fn("fuse_set_log_func", None, _LOG_FUNC)(_log_callback)
    if hasattr(lib, "fuse_unset_feature_flag"):          # 3.17.3 on (an inline before)
        fn("fuse_unset_feature_flag", None, ctypes.POINTER(ConnInfo), ctypes.c_uint64)
    fn("fuse_reply_err", ctypes.c_int, P, ctypes.c_int)
    fn("fuse_reply_entry", ctypes.c_int, P, ctypes.POINTER(EntryParam))
    fn("fuse_reply_attr", ctypes.c_int, P, ctypes.POINTER(Stat), ctypes.c_double)
    fn("fuse_reply_buf", ctypes.c_int, P, P, sz)
    fn("fuse_reply_open", ctypes.c_int, P, ctypes.POINTER(FileInfo))
    fn("fuse_reply_data", ctypes.c_int, P, ctypes.POINTER(FuseBufvec), ctypes.c_int)
    if hasattr(lib, "fuse_passthrough_open"):            # 3.17 on
        fn("fuse_passthrough_open", ctypes.c_int, P, ctypes.c_int)
    if hasattr(lib, "fuse_set_feature_flag"):            # 3.17.3 on (an inline before)
        fn("fuse_set_feature_flag", ctypes.c_bool, ctypes.POINTER(ConnInfo), ctypes.c_uint64)
    fn("fuse_reply_statfs", ctypes.c_int, P, ctypes.POINTER(Statvfs))
    fn("fuse_reply_write", ctypes.c_int, P, sz)
    fn("fuse_reply_create", ctypes.c_int, P, ctypes.POINTER(EntryParam), P)
    fn("fuse_req_ctx", ctypes.POINTER(FuseCtx), P)
    fn("fuse_lowlevel_notify_inval_inode", ctypes.c_int, P, ctypes.c_uint64, i64, i64)
    fn("fuse_reply_xattr", ctypes.c_int, P, sz)
    fn("fuse_add_direntry", sz, P, P, sz, ctypes.c_char_p, ctypes.POINTER(Stat), i64)
    fn("fuse_add_direntry_plus", sz, P, P, sz, ctypes.c_char_p, ctypes.POINTER(EntryParam), i64)
    fn("fuse_session_new", P, ctypes.POINTER(FuseArgs), P, sz, P)
    fn("fuse_session_mount", ctypes.c_int, P, ctypes.c_char_p)
    fn("fuse_set_signal_handlers", ctypes.c_int, P)
    fn("fuse_remove_signal_handlers", None, P)
    fn("fuse_session_loop", ctypes.c_int, P)
    fn("fuse_session_unmount", None, P)
    fn("fuse_session_exited", ctypes.c_int, P)
    fn("fuse_session_destroy", None, P)
    if hasattr(lib, "fuse_session_loop_mt_312"):           # 3.12 and later
        fn("fuse_session_loop_mt_312", ctypes.c_int, P, P)
        fn("fuse_loop_cfg_create", P)
        fn("fuse_loop_cfg_destroy", None, P)
    else:
        fn("fuse_session_loop_mt_32", ctypes.c_int, P, P)
    return lib


# libfuse's own messages ("fuse: unknown option ...") go to stderr, which is /dev/null in the
# daemon: they are sent to the log instead, and the last error kept for the one error line.
_LOG_FUNC = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_LOG_LEVELS = [logging.CRITICAL] * 3 + [logging.ERROR, logging.WARNING] + [logging.INFO] * 2 \
    + [logging.DEBUG]
_libfuse_said = {"error": None, "partial": ""}


def _log_libfuse(level, fmt, ap):
    # ap is a va_list: a pointer on x86_64, and passed by reference on aarch64 (AAPCS64
    # passes a composite of 32 bytes by address), so vsnprintf takes it as it came.
    buf = ctypes.create_string_buffer(1024)
    _vsnprintf(buf, len(buf), fmt, ap)
    text = _libfuse_said["partial"] + buf.value.decode(errors="replace")
    if not text.endswith("\n"):          # some messages come in pieces ("unknown option(s): `")
        _libfuse_said["partial"] = text
        return
    _libfuse_said["partial"] = ""
    text = " ".join(text.split())
    for prefix in ("fuse: ", "error: "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    level = _LOG_LEVELS[min(max(level, 0), 7)]
    if level >= logging.ERROR:
        _libfuse_said["error"] = text
    log.log(level, "libfuse: %s", text)


_log_callback = _LOG_FUNC(_log_libfuse)
_vsnprintf = ctypes.CDLL(None).vsnprintf
_vsnprintf.restype = ctypes.c_int
_vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]


def describe(lib) -> str:
    """"libfuse 3.17.2 (/usr/lib/.../libfuse3.so.3.17.2)": which library this process uses."""
    path = "?"
    try:
        with open("/proc/self/maps") as f:
            path = next((line.split()[-1] for line in f if "/libfuse3.so" in line), path)
    except OSError:
        pass
    return f"libfuse {lib.fuse_pkgversion().decode(errors='replace')} ({path})"


_lib = None


def libfuse():
    global _lib
    if _lib is None:
        _lib = _load()
    return _lib


# "." and "..": a name and a type, never attributes (the kernel knows both directories).
_DOTS = ((b".", Entry(ROOT_INO, True, None, 2)), (b"..", Entry(ROOT_INO, True, None, 2)))


class _LoopConfig32(ctypes.Structure):         # struct fuse_loop_config before 3.12
    _fields_ = [("clone_fd", ctypes.c_int), ("max_idle_threads", ctypes.c_uint)]


class Session:
    """One mount served by libfuse's loop, calling into ``fs``.

    ``fs`` is a ``tensorfs.mount.operations.Operations``: its methods, documented there, answer
    the kernel's requests.  ``FsError(errno)`` is answered as it is; ``errno_of(exc)``
    (given: the filesystem's ``Operations.errno_of``) maps (and may log) any other exception.

    How a local file's bytes reach the kernel (``mechanism``, chosen at INIT and logged once):

    - ``passthrough``: a file that ``open`` gives a descriptor for is read by the kernel from
      that descriptor itself, page cache, read-ahead and mmap included: no request reaches
      the daemon after the open (libfuse >= 3.17, Linux >= 6.9, root: registering a backing
      file needs CAP_SYS_ADMIN).  One backing id per inode, registered at its first open and
      kept until unmount (the kernel refuses a second backing file for an open inode);
    - ``splice``: a read that ``read_fd`` answers is replied with ``fuse_reply_data`` naming
      the descriptor and offset: libfuse splices the pages from the file to /dev/fuse;
    - ``copy``: the same reply where libfuse cannot splice (it copies, in C).

    Reads ``read_fd`` does not answer (generated files, converted views, remote files) are
    copied through ``read_into`` whatever the mechanism.
    """

    def __init__(self, fs, *, uid: int, gid: int, mtime_ns: int, block_size: int,
                 attr_timeout: float = 86400.0, entry_timeout: float = 86400.0,
                 negative_timeout: float = 86400.0, read_ahead_kib: int = 0,
                 errno_of=lambda exc: errno.EIO, splice: bool = False, editable: bool = False,
                 passthrough: bool = False, file_mode: int = 0o444):
        self.fs = fs
        self.editable = editable            # --edits: the write handlers below are installed
        self.lib = libfuse()
        self.errno_of = errno_of
        self.attr_timeout, self.entry_timeout = attr_timeout, entry_timeout
        self.negative_timeout = negative_timeout
        self.block_size = block_size
        self.uid, self.gid = uid, gid
        # every node's mode but a file with its own (``Entry.owner``): read-only, no more
        # than the model's files grant; a directory may be entered by whom may read
        self.file_mode = file_mode & 0o444
        self.dir_mode = ((self.file_mode | self.file_mode >> 2) & 0o555) | 0o200
        self.mtime = divmod(mtime_ns, 1_000_000_000)
        self._pinned = threading.local()
        self._buffers: list[ctypes.Array] = []
        self._buffers_lock = threading.Lock()
        self.read_ahead_kib = read_ahead_kib
        self._mountpoint = None
        self._tune_pending = False
        self._max_read = 0
        # "Live": a request other than INIT was answered, so the kernel took libfuse's INIT
        # reply (libfuse checks the init callback's answer after it returns, and may refuse).
        self._live = False
        self._ended = False
        self._init_done = threading.Event()
        self._ready_lock = threading.Lock()
        self.mechanism = self._fallback = COPY
        self.splice = splice                    # offered where there is no passthrough
        self.passthrough = passthrough          # asked for (tensorfs.mount.adapter.PASSTHROUGH)
        self._backing: dict[int, int] = {}      # inode -> backing id (0: refused)
        self._backing_lock = threading.Lock()
        self._se = None                         # the session, while serving (invalidate)
        self._inval_lock = threading.Lock()
        self._inval_queue: list = []
        self._inval_wake = threading.Event()
        self._inval_thread = None

    # -- filling the C structures -------------------------------------------------------------
    def _fill_stat(self, st, entry: Entry) -> None:
        st.st_ino = entry.ino
        # Files grant no read bit the model's files lack; directories grant the same, plus the
        # owner's write bit, as a copy should have: `cp -r` keeps the modes, and a copy of
        # 0555 directories is one its owner cannot empty (rm -rf fails).  The mount stays
        # read-only (mounted ro: the kernel answers EROFS) unless it has --edits.
        st.st_mode = (stat.S_IFDIR | self.dir_mode) if entry.is_dir else (stat.S_IFREG |
                                                                          self.file_mode)
        if entry.writable:
            st.st_mode |= 0o200
        st.st_nlink = entry.nlink
        st.st_size = entry.size
        st.st_blocks = (entry.size + 511) // 512
        st.st_blksize = self.block_size
        st.st_uid, st.st_gid = self.uid, self.gid
        if entry.owner is not None:
            mode, st.st_uid, st.st_gid = entry.owner
            st.st_mode = stat.S_IFREG | mode
        sec, nsec = self.mtime if entry.mtime_ns is None else divmod(entry.mtime_ns, 1_000_000_000)
        for ts in (st.st_atim, st.st_mtim, st.st_ctim):
            ts.tv_sec, ts.tv_nsec = sec, nsec

    def _entry_param(self, entry: Entry) -> EntryParam:
        e = EntryParam()
        e.ino = entry.ino
        e.attr_timeout, e.entry_timeout = self.attr_timeout, self.entry_timeout
        self._fill_stat(e.attr, entry)
        return e

    # -- the callbacks: each answers its request exactly once ----------------------------------
    def _guarded(self, method):
        """A callback that keeps its thread's Python state (see below) and turns an exception
        into an error reply.

        ctypes wraps every callback from a thread Python did not start in
        PyGILState_Ensure/Release, creating and destroying a Python thread state each time
        (-27 % daemon CPU per GiB read, docs/serving.md).  One extra Ensure, never released,
        on the first call from each libfuse thread keeps the state.  That is only sound while
        libfuse keeps its workers: ``_loop`` makes sure it never destroys an idle one."""
        lib, pinned, errno_of = self.lib, self._pinned, self.errno_of

        def callback(req, *args):
            if not getattr(pinned, "yes", False):
                ctypes.pythonapi.PyGILState_Ensure()
                pinned.yes = True
                self._live = True
                if self._tune_pending:          # the first request after INIT is some
                    self._raise_read_ahead()    # thread's first: no check on the hot path
            try:
                method(req, *args)
            except FsError as exc:
                lib.fuse_reply_err(req, exc.errno)
            except BaseException as exc:        # an unanswered request would hang its caller
                lib.fuse_reply_err(req, errno_of(exc))
        return callback

    def _init(self, userdata, conn):
        # Always READDIRPLUS, not only for a listing's first page: `find` reads a whole
        # directory before it descends, and every entry without attributes costs a LOOKUP.
        self._unset_want(conn, FUSE_CAP_READDIRPLUS_AUTO)
        # Lookups and listings of one directory at once: without it the kernel holds the
        # directory's lock across each LOOKUP, so one slow answer delays every other name.
        if self._capable(conn, FUSE_CAP_PARALLEL_DIROPS):
            self._set_want(conn, FUSE_CAP_PARALLEL_DIROPS)
        # libfuse refuses INIT unless the filesystem repeats `-o max_read=N` here
        # (fuse_common.h: it "must be set both here and passed to fuse_session_new()").
        conn.contents.max_read = self._max_read
        self._tune_pending = self.read_ahead_kib > 0
        self.mechanism = self._choose_mechanism(conn)
        self._init_done.set()

    def _choose_mechanism(self, conn) -> str:
        lib = self.lib
        splice = self.splice and self._capable(conn, FUSE_CAP_SPLICE_WRITE)
        if splice:
            self._set_want(conn, FUSE_CAP_SPLICE_WRITE)
        self._fallback = SPLICE if splice else COPY
        if (self.passthrough and lib.version >= 317 and hasattr(lib, "fuse_passthrough_open")
                and self._capable(conn, FUSE_CAP_PASSTHROUGH) and os.geteuid() == 0):
            self._set_want(conn, FUSE_CAP_PASSTHROUGH)
            conn.contents.max_backing_stack_depth = BACKING_STACKED_OVER
            log.info("local files: passthrough (the kernel reads whole files from their "
                     "backing file; tensor files by %s)", self._fallback)
            return PASSTHROUGH
        why = ("not asked for: TENSORFS_PASSTHROUGH=1" if not self.passthrough else
               "libfuse 3.17 or later needed" if lib.version < 317 else
               "not root" if os.geteuid() != 0 else "the kernel does not offer it")
        log.info("local files: %s (no passthrough: %s)", self._fallback, why)
        return self._fallback

    def _capable(self, conn, flag: int) -> bool:
        info = conn.contents
        return bool((info.capable_ext if self.lib.version >= 317 else info.capable) & flag)

    def _set_want(self, conn, flag: int) -> None:
        """Ask for a capability the kernel offers (the counterpart of ``_unset_want``)."""
        lib = self.lib
        if hasattr(lib, "fuse_set_feature_flag"):
            lib.fuse_set_feature_flag(conn, flag)
        elif lib.version >= 317:
            conn.contents.want_ext |= flag
        else:
            conn.contents.want |= flag

    def _unset_want(self, conn, flag: int) -> None:
        """Turn off a capability libfuse would ask for.  3.17 moved the flags to the 64-bit
        ``want_ext`` (``want`` still works: libfuse converts it after ``init``, as long as
        ``want_ext`` is left alone).  3.17.3 exports ``fuse_unset_feature_flag``; 3.17.0-2
        have it as an inline function on ``want_ext``, done here the same way."""
        lib = self.lib
        if hasattr(lib, "fuse_unset_feature_flag"):
            lib.fuse_unset_feature_flag(conn, flag)
        elif lib.version >= 317:
            conn.contents.want_ext &= ~flag
        else:
            conn.contents.want &= ~flag

    def _raise_read_ahead(self) -> None:
        """Let the kernel read ahead ``read_ahead_kib`` on this mount.

        libfuse 3 accepts requests of up to 1 MiB, but the kernel sends a sequential reader's
        reads in read-ahead windows, 128 KiB by default for a FUSE mount, and the INIT reply
        can only lower that.  The mount's own backing device takes a larger window through
        sysfs (root only), once INIT is done: hence here, on a first request.  Benchmark
        rows 1 and 4 (docs/serving.md)."""
        self._tune_pending = False
        device = mount_device(self._mountpoint)
        path = f"/sys/class/bdi/{device}/read_ahead_kb"
        try:
            with open(path) as f:
                if int(f.read()) >= self.read_ahead_kib:
                    return
            with open(path, "w") as f:
                f.write(str(self.read_ahead_kib))
        except (OSError, ValueError) as error:
            log.info("read-ahead stays at the kernel's default: %s", error)

    def _lookup(self, req, parent, name):
        try:
            entry = self.fs.lookup(parent, name.decode("utf-8", "surrogateescape"))
        except FsError as exc:
            if exc.errno != errno.ENOENT:
                raise
            e = EntryParam()                    # ino 0: "no such name", cached this long
            e.entry_timeout = self.negative_timeout
            self.lib.fuse_reply_entry(req, e)
            return
        self.lib.fuse_reply_entry(req, self._entry_param(entry))

    def _getattr(self, req, ino, fi):
        st = Stat()
        self._fill_stat(st, self.fs.getattr(ino))
        self.lib.fuse_reply_attr(req, st, self.attr_timeout)

    def _no_open(self, req, ino, fi):
        # ENOSYS once: the kernel then opens directories without asking, keeping their
        # cached listings across opens.
        self.lib.fuse_reply_err(req, errno.ENOSYS)

    def _open(self, req, ino, fi):
        """Every file open is answered (not ENOSYS once, which would leave the kernel no way
        to ask for a backing file, nor tensorfs a moment to refuse a changed file): with the
        page cache kept (FOPEN_KEEP_CACHE, what ENOSYS used to give) and no FLUSH on close,
        or with a backing file (passthrough).  Writes never get here (`ro`)."""
        fd = self.fs.open(ino)
        pointer = ctypes.cast(fi, ctypes.POINTER(FileInfo))
        info = pointer.contents
        if fd is not None and self.mechanism == PASSTHROUGH:
            backing = self._backing_id(req, ino, fd)
            if backing > 0:
                # the kernel refuses any flag but these with a backing file (and the page
                # cache is the backing file's own)
                info._bits = (info._bits & ~FI_KEEP_CACHE) | FI_NOFLUSH
                info.backing_id = backing
                self.lib.fuse_reply_open(req, pointer)
                return
        info._bits |= FI_KEEP_CACHE | FI_NOFLUSH
        self.lib.fuse_reply_open(req, pointer)

    def _backing_id(self, req, ino: int, fd: int) -> int:
        with self._backing_lock:
            backing = self._backing.get(ino)
            if backing is None:
                backing = self._backing[ino] = self.lib.fuse_passthrough_open(req, fd)
                if backing <= 0:
                    log.warning("passthrough refused for inode %d (%s): its reads go by %s",
                                ino, _libfuse_said["error"] or "no reason given",
                                self._fallback)
            return backing

    def _take_buffer(self, size: int):
        with self._buffers_lock:
            if self._buffers and len(self._buffers[-1]) >= size:
                return self._buffers.pop()
        return (ctypes.c_char * max(size, 1 << 20))()

    def _read(self, req, ino, size, offset, fi):
        ranged = self.fs.read_fd(ino, offset, size)
        if ranged is not None:
            fd, pos, n = ranged
            if n <= 0:
                self.lib.fuse_reply_buf(req, None, 0)
                return
            vec = FuseBufvec(1, 0, 0)
            part = vec.buf[0]
            part.size, part.flags, part.fd, part.pos = n, FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK, fd, pos
            # libfuse splices (or copies) the range to /dev/fuse, and answers a failed read
            # of the descriptor with its errno itself
            self.lib.fuse_reply_data(req, vec, 0)
            return
        buf = self._take_buffer(size)
        try:
            n = self.fs.read_into(ino, offset, memoryview(buf).cast("B")[:size])
            self.lib.fuse_reply_buf(req, buf, n)
        finally:
            with self._buffers_lock:
                if len(self._buffers) < 8:
                    self._buffers.append(buf)

    def _readdir(self, req, ino, size, offset, fi, plus=False):
        if not plus:                            # only if READDIRPLUS_AUTO stayed on
            log.debug("READDIR without attributes: inode %d from entry %d", ino, offset)
        entries = self.fs.listing(ino)
        buf = ctypes.create_string_buffer(size)
        used = 0
        st, e = Stat(), EntryParam()
        e.attr_timeout, e.entry_timeout = self.attr_timeout, self.entry_timeout
        add_plus, add = self.lib.fuse_add_direntry_plus, self.lib.fuse_add_direntry
        for index in range(offset, len(entries) + 2):
            if index < 2:
                name, entry = _DOTS[index]
            else:
                text, entry = entries[index - 2]
                name = text.encode("utf-8", "surrogateescape")
            kind = stat.S_IFDIR if entry.is_dir else stat.S_IFREG
            if plus:
                if entry.size is None:
                    e.ino = 0                   # a name and a type only
                    e.attr.st_ino, e.attr.st_mode = entry.ino, kind
                else:
                    e.ino = entry.ino
                    self._fill_stat(e.attr, entry)
                n = add_plus(req, ctypes.addressof(buf) + used, size - used, name, e, index + 1)
            else:
                st.st_ino, st.st_mode = entry.ino, kind
                n = add(req, ctypes.addressof(buf) + used, size - used, name, st, index + 1)
            if n > size - used:
                break
            used += n
        self.lib.fuse_reply_buf(req, buf, used)

    def _readdirplus(self, req, ino, size, offset, fi):
        self._readdir(req, ino, size, offset, fi, plus=True)

    def _statfs(self, req, ino):
        sv = Statvfs()
        sv.f_bsize = sv.f_frsize = self.block_size
        sv.f_namemax = 255
        self.lib.fuse_reply_statfs(req, sv)

    def _reply_sized(self, req, data: bytes, size: int):
        """The xattr protocol: size 0 asks for the length, a short buffer is ERANGE."""
        if size == 0:
            self.lib.fuse_reply_xattr(req, len(data))
        elif len(data) > size:
            self.lib.fuse_reply_err(req, errno.ERANGE)
        else:
            self.lib.fuse_reply_buf(req, data, len(data))

    def _getxattr(self, req, ino, name, size):
        self._reply_sized(req, self.fs.getxattr(ino, name.decode("utf-8", "surrogateescape")), size)

    def _listxattr(self, req, ino, size):
        names = self.fs.listxattr(ino)
        self._reply_sized(req, b"".join(n.encode() + b"\0" for n in names), size)

    # -- an editable mount (--edits) ------------------------------------------------------------
    def _edit_handlers(self) -> dict:
        """Opens with a handle (a reader's snapshot, a writer's buffer), reads through it, and
        the calls that change the tree.  Every change is checked against the mount's owner:
        under allow_other another user may read, never edit."""
        g = self._guarded
        return {"open": g(self._open_editable), "read": g(self._read_editable),
                "write": g(self._write), "flush": g(self._flush), "release": g(self._release),
                "create": g(self._create), "setattr": g(self._setattr),
                "unlink": g(self._unlink), "rmdir": g(self._rmdir), "rename": g(self._rename),
                "setxattr": g(self._setxattr)}

    def invalidate(self, inodes) -> None:
        """Tell the kernel to drop the attributes and cached pages (a directory's: its
        listing) of ``inodes``: an edit changed them.  Said by a thread of its own, waited
        for at most ``INVALIDATE_WAIT_S``: the kernel may have to wait for a page lock held
        by a reader whose READ only this daemon answers (with one thread, the one waiting
        here), so the edit's reply does not wait on it forever; normally the reply leaves
        once the kernel has forgotten what changed, and the next stat or open sees it."""
        if not self._se:
            return
        done = threading.Event()
        with self._inval_lock:
            if self._inval_thread is None:
                self._inval_thread = threading.Thread(target=self._invalidating,
                                                      name="tensorfs-invalidate", daemon=True)
                self._inval_thread.start()
            self._inval_queue.append((list(inodes), done))
            self._inval_wake.set()
        done.wait(INVALIDATE_WAIT_S)

    def _invalidating(self) -> None:
        while True:
            self._inval_wake.wait()
            with self._inval_lock:
                work, self._inval_queue = self._inval_queue, []
                self._inval_wake.clear()
            for inodes, done in work:
                for ino in inodes:
                    se = self._se
                    if se:
                        self.lib.fuse_lowlevel_notify_inval_inode(se, ino, 0, 0)
                done.set()

    def _owner_only(self, req) -> None:
        ctx = self.lib.fuse_req_ctx(req)
        if not ctx or ctx.contents.uid != os.geteuid():
            raise FsError(errno.EACCES)

    def _open_editable(self, req, ino, fi):
        """No page cache kept across opens (an edit changes what a file holds), no backing
        file (a composed file has none); a file opened for writing is flushed on close,
        where its edit takes effect."""
        info = ctypes.cast(fi, ctypes.POINTER(FileInfo)).contents
        if info.flags & os.O_ACCMODE != os.O_RDONLY:
            self._owner_only(req)
            info.fh = self.fs.open_write(ino, bool(info.flags & os.O_TRUNC))
            info._bits &= ~(FI_KEEP_CACHE | FI_NOFLUSH)
        else:
            info.fh = self.fs.open_read(ino)
            info._bits = (info._bits & ~FI_KEEP_CACHE) | FI_NOFLUSH
        self.lib.fuse_reply_open(req, ctypes.cast(fi, ctypes.POINTER(FileInfo)))

    @staticmethod
    def _fh(fi) -> int:
        return ctypes.cast(fi, ctypes.POINTER(FileInfo)).contents.fh if fi else 0

    def _read_editable(self, req, ino, size, offset, fi):
        buf = self._take_buffer(size)
        try:
            n = self.fs.read_handle(ino, self._fh(fi), offset, memoryview(buf).cast("B")[:size])
            self.lib.fuse_reply_buf(req, buf, n)
        finally:
            with self._buffers_lock:
                if len(self._buffers) < 8:
                    self._buffers.append(buf)

    def _write(self, req, ino, data, size, offset, fi):
        n = self.fs.write(ino, self._fh(fi), offset, ctypes.string_at(data, size))
        self.lib.fuse_reply_write(req, n)

    def _flush(self, req, ino, fi):
        self.fs.flush(ino, self._fh(fi))
        self.lib.fuse_reply_err(req, 0)

    def _release(self, req, ino, fi):
        self.fs.release(ino, self._fh(fi))
        self.lib.fuse_reply_err(req, 0)

    def _create(self, req, parent, name, mode, fi):
        self._owner_only(req)
        entry, fh = self.fs.create(parent, name.decode("utf-8", "surrogateescape"))
        info = ctypes.cast(fi, ctypes.POINTER(FileInfo)).contents
        info.fh = fh
        info._bits &= ~(FI_KEEP_CACHE | FI_NOFLUSH)
        self.lib.fuse_reply_create(req, self._entry_param(entry), fi)

    def _setattr(self, req, ino, attr, to_set, fi):
        if to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID):
            raise FsError(errno.EPERM)
        if to_set & FUSE_SET_ATTR_SIZE:
            self._owner_only(req)
            size = ctypes.cast(attr, ctypes.POINTER(Stat)).contents.st_size
            self.fs.truncate(ino, size, self._fh(fi))
        # times are the mount's: a request to set them is answered, not kept
        st = Stat()
        self._fill_stat(st, self.fs.getattr(ino, self._fh(fi)))
        self.lib.fuse_reply_attr(req, st, self.attr_timeout)

    def _unlink(self, req, parent, name):
        self._owner_only(req)
        self.fs.unlink(parent, name.decode("utf-8", "surrogateescape"))
        self.lib.fuse_reply_err(req, 0)

    def _rmdir(self, req, parent, name):
        self._owner_only(req)
        self.fs.rmdir(parent, name.decode("utf-8", "surrogateescape"))
        self.lib.fuse_reply_err(req, 0)

    def _rename(self, req, parent, name, new_parent, new_name, flags):
        self._owner_only(req)
        if flags:                           # RENAME_EXCHANGE, RENAME_NOREPLACE ...
            raise FsError(errno.EINVAL)
        self.fs.rename(parent, name.decode("utf-8", "surrogateescape"), new_parent,
                       new_name.decode("utf-8", "surrogateescape"))
        self.lib.fuse_reply_err(req, 0)

    def _setxattr(self, req, ino, name, value, size, flags):
        self._owner_only(req)
        self.fs.setxattr(ino, name.decode("utf-8", "surrogateescape"),
                         ctypes.string_at(value, size))
        self.lib.fuse_reply_err(req, 0)

    # -- the loop -------------------------------------------------------------------------------
    def serve(self, mountpoint: str, options: MountOptions, on_ready=None,
              on_stop=None) -> None:
        """Mount at ``mountpoint`` (a resolved path), call ``on_ready()`` once the mount
        answers requests, serve until unmounted or SIGINT/SIGTERM/SIGHUP, unmount.
        ``on_stop()`` is called (from another thread) as soon as the session is told to
        end, while requests may still be in flight: libfuse waits for them before it
        returns, so what could keep them waiting must end there.

        ``FuseUnavailable`` (one line) when libfuse refuses the options or the mount, when the
        session ends before the mount was live (libfuse refused the INIT answer), or when its
        loop ends with an error."""
        lib = self.lib
        log.info("%s", describe(lib))
        self._max_read = options.max_read
        threads = options.threads
        mount_options = options.libfuse_options()
        handlers = {"init": self._init, "lookup": self._guarded(self._lookup),
                    "getattr": self._guarded(self._getattr),
                    "open": self._guarded(self._open), "opendir": self._guarded(self._no_open),
                    "read": self._guarded(self._read), "readdir": self._guarded(self._readdir),
                    "readdirplus": self._guarded(self._readdirplus),
                    "statfs": self._guarded(self._statfs),
                    "getxattr": self._guarded(self._getxattr),
                    "listxattr": self._guarded(self._listxattr)}
        if self.editable:
            handlers.update(self._edit_handlers())
        self._callbacks = {name: CALLBACK_TYPES[name](fn) for name, fn in handlers.items()}
        ops = (ctypes.c_void_p * len(OPS_SLOTS))()
        for name, cb in self._callbacks.items():
            ops[OPS_SLOTS.index(name)] = ctypes.cast(cb, ctypes.c_void_p)

        argv_list = [b"tensorfs"]
        if mount_options:
            argv_list += [b"-o", ",".join(mount_options).encode("utf-8", "surrogateescape")]
        argv = (ctypes.c_char_p * (len(argv_list) + 1))(*argv_list, None)
        args = FuseArgs(len(argv_list), argv, 0)
        self._mountpoint = mountpoint
        _libfuse_said["error"] = None
        se = lib.fuse_session_new(ctypes.byref(args), ops, ctypes.sizeof(ops), None)
        if not se:
            raise FuseUnavailable(_libfuse_said["error"] or
                                  f"libfuse refused the mount options: {','.join(mount_options)}")
        try:
            # libfuse installs its SIGINT/SIGTERM/SIGHUP handlers only where the default is
            # in place; Python's own SIGINT handler would never run while the loop blocks.
            previous = signal.signal(signal.SIGINT, signal.SIG_DFL)
            if lib.fuse_set_signal_handlers(se) != 0:
                raise FuseUnavailable("could not install the FUSE signal handlers")
            self._se = se
            try:
                if lib.fuse_session_mount(se, mountpoint.encode("utf-8", "surrogateescape")) != 0:
                    raise FuseUnavailable(_libfuse_said["error"] or f"{mountpoint}: mount failed")
                threading.Thread(target=self._announce, args=(mountpoint, on_ready),
                                 name="tensorfs-ready", daemon=True).start()
                if on_stop is not None:
                    threading.Thread(target=self._watch_exit, args=(se, on_stop),
                                     name="tensorfs-stop-watch", daemon=True).start()
                try:
                    code = self._loop(se, threads)
                finally:
                    with self._ready_lock:
                        self._ended = True
                    self._init_done.set()
                    lib.fuse_session_unmount(se)
            finally:
                lib.fuse_remove_signal_handlers(se)
                signal.signal(signal.SIGINT, previous)
        finally:
            self._se = None
            lib.fuse_session_destroy(se)
        # The loop returns 0 (unmounted), the signal that ended it, or -errno.
        if code < 0 or (code == 0 and not self._live):
            reason = _libfuse_said["error"] or (os.strerror(-code) if code < 0 else "unmounted")
            when = "" if self._live else " before the mount was live"
            raise FuseUnavailable(f"{mountpoint}: libfuse ended the session{when}: {reason}")

    def _announce(self, mountpoint: str, on_ready) -> None:
        """Call ``on_ready`` once the mount answers.  A mount point is mounted before INIT,
        and libfuse checks the init callback's answer only after it returns, so neither
        says "mounted".  This asks for the mount point's extended attributes (a request the
        kernel never answers from its caches, held back until INIT is done) and looks
        whether a request reached the daemon; a thread of its own, so that a single-threaded
        loop answers it."""
        if descriptor_of(mountpoint) is not None:
            # /dev/fd/N: mounted by whoever opened the descriptor, whose kernel queued INIT
            # at mount(2); there is no path here to probe, and INIT answered is the mark.
            self._init_done.wait()
            with self._ready_lock:
                self._live = self._live or not self._ended
        else:
            try:
                os.listxattr(mountpoint)
            except OSError as error:
                log.debug("readiness probe: %s", error)
        with self._ready_lock:
            if not self._live or self._ended:
                return
            log.info("serving %s", mountpoint)
            if on_ready is not None:
                try:
                    on_ready()
                except Exception:
                    log.exception("readiness could not be signalled")

    STOP_POLL_S = 0.1

    def _watch_exit(self, se, on_stop) -> None:
        """Call ``on_stop`` once libfuse's session is told to exit: its signal handler
        (SIGTERM, SIGINT, SIGHUP) or the kernel ending the connection (an unmount) set the
        flag, and the loop then waits for the requests in flight.  A poll, because the
        signal handler is libfuse's (a Python handler would run only when the main thread,
        blocked in the loop, returned)."""
        while True:
            with self._ready_lock:
                if self._ended or self.lib.fuse_session_exited(se):
                    break
            time.sleep(self.STOP_POLL_S)
        try:
            on_stop()
        except Exception:
            log.exception("stopping the mount's work failed")

    def _loop(self, se, threads: bool) -> int:
        lib = self.lib
        if not threads:
            return lib.fuse_session_loop(se)
        if hasattr(lib, "fuse_loop_cfg_create"):
            # 3.12 on: the defaults keep every idle worker (max_idle_threads -1) and start at
            # most 10.
            config = lib.fuse_loop_cfg_create()
            try:
                return lib.fuse_session_loop_mt_312(se, config)
            finally:
                lib.fuse_loop_cfg_destroy(config)
        # Before 3.12 workers are started without a cap, and those idle beyond
        # max_idle_threads are destroyed, each leaking the Python thread state it pinned
        # (the usual 10 on 3.10.5: +3.9 MB per 2000 bursts, growing without end; none kept:
        # flat, docs/serving.md).  So none is destroyed: the pool stays at the most requests
        # ever in flight at once.  INT_MAX, the largest value libfuse reads as an int:
        # UINT_MAX would compare as -1 and destroy every worker after each request.
        config = _LoopConfig32(0, 2**31 - 1)
        return lib.fuse_session_loop_mt_32(se, ctypes.byref(config))
