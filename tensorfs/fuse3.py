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
from typing import NamedTuple

log = logging.getLogger("tensorfs")

ROOT_INO = 1
FUSE_CAP_READDIRPLUS_AUTO = 1 << 14


class FuseUnavailable(RuntimeError):
    """libfuse 3 is missing or refused the mount: said in one line by the CLI."""


class FsError(OSError):
    """A deliberate answer (ENOENT, ENOTDIR, ENODATA ...), sent as it is."""

    def __init__(self, code: int):
        super().__init__(code, os.strerror(code))


class Entry(NamedTuple):
    """What ``stat`` says of one node.  The rest (owner, times, block size) is the same for
    every node of a mount and given to ``Session``.  In a listing, ``size`` None means "not
    known without work": that entry goes without attributes and the kernel looks it up."""
    ino: int
    is_dir: bool
    size: int | None
    nlink: int


# -- the C structures (x86_64 and aarch64 Linux; checked against libfuse 3.14's headers) ----

class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


if platform.machine() in ("x86_64", "AMD64"):
    class Stat(ctypes.Structure):
        _fields_ = [("st_dev", ctypes.c_uint64), ("st_ino", ctypes.c_uint64),
                    ("st_nlink", ctypes.c_uint64), ("st_mode", ctypes.c_uint32),
                    ("st_uid", ctypes.c_uint32), ("st_gid", ctypes.c_uint32),
                    ("_pad0", ctypes.c_int32), ("st_rdev", ctypes.c_uint64),
                    ("st_size", ctypes.c_int64), ("st_blksize", ctypes.c_int64),
                    ("st_blocks", ctypes.c_int64), ("st_atim", Timespec),
                    ("st_mtim", Timespec), ("st_ctim", Timespec),
                    ("_reserved", ctypes.c_int64 * 3)]
elif platform.machine() in ("aarch64", "arm64"):
    class Stat(ctypes.Structure):          # the generic 64-bit layout
        _fields_ = [("st_dev", ctypes.c_uint64), ("st_ino", ctypes.c_uint64),
                    ("st_mode", ctypes.c_uint32), ("st_nlink", ctypes.c_uint32),
                    ("st_uid", ctypes.c_uint32), ("st_gid", ctypes.c_uint32),
                    ("st_rdev", ctypes.c_uint64), ("_pad1", ctypes.c_uint64),
                    ("st_size", ctypes.c_int64), ("st_blksize", ctypes.c_int32),
                    ("_pad2", ctypes.c_int32), ("st_blocks", ctypes.c_int64),
                    ("st_atim", Timespec), ("st_mtim", Timespec), ("st_ctim", Timespec),
                    ("_reserved", ctypes.c_int32 * 2)]
else:
    Stat = None


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
    _fields_ = [("proto_major", ctypes.c_uint), ("proto_minor", ctypes.c_uint),
                ("max_write", ctypes.c_uint), ("max_read", ctypes.c_uint),
                ("max_readahead", ctypes.c_uint), ("capable", ctypes.c_uint),
                ("want", ctypes.c_uint), ("max_background", ctypes.c_uint),
                ("congestion_threshold", ctypes.c_uint), ("time_gran", ctypes.c_uint),
                ("reserved", ctypes.c_uint * 22)]


class FuseArgs(ctypes.Structure):
    _fields_ = [("argc", ctypes.c_int), ("argv", ctypes.POINTER(ctypes.c_char_p)),
                ("allocated", ctypes.c_int)]


# struct fuse_lowlevel_ops: function pointers in this order (fuse_lowlevel.h, 3.0 to 3.17;
# later versions only append).  A slot left NULL is answered by libfuse itself.
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
}


def _load():
    name = ctypes.util.find_library("fuse3") or "libfuse3.so.3"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        raise FuseUnavailable("libfuse 3 not found: install Debian's fuse3 (apt-get install fuse3)") from None
    if Stat is None:
        raise FuseUnavailable(f"no struct stat layout for {platform.machine()} (x86_64 and aarch64 only)")

    def fn(symbol, restype, *argtypes):
        f = getattr(lib, symbol)
        f.restype, f.argtypes = restype, list(argtypes)
        return f

    P, sz, i64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64
    lib.version = lib.fuse_version()
    fn("fuse_reply_err", ctypes.c_int, P, ctypes.c_int)
    fn("fuse_reply_entry", ctypes.c_int, P, ctypes.POINTER(EntryParam))
    fn("fuse_reply_attr", ctypes.c_int, P, ctypes.POINTER(Stat), ctypes.c_double)
    fn("fuse_reply_buf", ctypes.c_int, P, P, sz)
    fn("fuse_reply_statfs", ctypes.c_int, P, ctypes.POINTER(Statvfs))
    fn("fuse_reply_xattr", ctypes.c_int, P, sz)
    fn("fuse_add_direntry", sz, P, P, sz, ctypes.c_char_p, ctypes.POINTER(Stat), i64)
    fn("fuse_add_direntry_plus", sz, P, P, sz, ctypes.c_char_p, ctypes.POINTER(EntryParam), i64)
    fn("fuse_session_new", P, ctypes.POINTER(FuseArgs), P, sz, P)
    fn("fuse_session_mount", ctypes.c_int, P, ctypes.c_char_p)
    fn("fuse_set_signal_handlers", ctypes.c_int, P)
    fn("fuse_remove_signal_handlers", None, P)
    fn("fuse_session_loop", ctypes.c_int, P)
    fn("fuse_session_unmount", None, P)
    fn("fuse_session_destroy", None, P)
    if hasattr(lib, "fuse_session_loop_mt_312"):           # 3.12 and later
        fn("fuse_session_loop_mt_312", ctypes.c_int, P, P)
        fn("fuse_loop_cfg_create", P)
        fn("fuse_loop_cfg_destroy", None, P)
    else:
        fn("fuse_session_loop_mt_32", ctypes.c_int, P, P)
    return lib


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

    ``fs`` answers:  ``lookup(parent_ino, name) -> Entry``, ``getattr(ino) -> Entry``,
    ``listing(ino) -> [(name, Entry)]`` (a directory's entries after "." and ".."),
    ``read_into(ino, offset, buf) -> n``, ``getxattr(ino, name) -> bytes``,
    ``listxattr(ino) -> [str]``, and ``on_init()``.  ``FsError(errno)`` is answered as it is;
    ``errno_of(exc)`` maps (and may log) any other exception.
    """

    def __init__(self, fs, *, uid: int, gid: int, mtime_ns: int, block_size: int,
                 attr_timeout: float = 86400.0, entry_timeout: float = 86400.0,
                 negative_timeout: float = 86400.0, read_ahead_kib: int = 0,
                 errno_of=lambda exc: errno.EIO):
        self.fs = fs
        self.lib = libfuse()
        self.errno_of = errno_of
        self.attr_timeout, self.entry_timeout = attr_timeout, entry_timeout
        self.negative_timeout = negative_timeout
        self.block_size = block_size
        self.uid, self.gid = uid, gid
        self.mtime = divmod(mtime_ns, 1_000_000_000)
        self._pinned = threading.local()
        self._buffers: list[ctypes.Array] = []
        self._buffers_lock = threading.Lock()
        self.read_ahead_kib = read_ahead_kib
        self._mountpoint = None
        self._tune_pending = False

    # -- filling the C structures -------------------------------------------------------------
    def _fill_stat(self, st, entry: Entry) -> None:
        st.st_ino = entry.ino
        st.st_mode = (stat.S_IFDIR | 0o555) if entry.is_dir else (stat.S_IFREG | 0o444)
        st.st_nlink = entry.nlink
        st.st_size = entry.size
        st.st_blocks = (entry.size + 511) // 512
        st.st_blksize = self.block_size
        st.st_uid, st.st_gid = self.uid, self.gid
        sec, nsec = self.mtime
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
        on the first call from each libfuse thread keeps the state.  libfuse 3 keeps its
        worker threads (``max_idle_threads`` unset), so few are ever made."""
        lib, pinned, errno_of = self.lib, self._pinned, self.errno_of

        def callback(req, *args):
            if not getattr(pinned, "yes", False):
                ctypes.pythonapi.PyGILState_Ensure()
                pinned.yes = True
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
        conn.contents.want &= ~FUSE_CAP_READDIRPLUS_AUTO
        self._tune_pending = self.read_ahead_kib > 0
        try:
            self.fs.on_init()
        except Exception:
            log.exception("init failed")

    def _raise_read_ahead(self) -> None:
        """Let the kernel read ahead ``read_ahead_kib`` on this mount.

        libfuse 3 accepts requests of up to 1 MiB, but the kernel sends a sequential reader's
        reads in read-ahead windows, 128 KiB by default for a FUSE mount, and the INIT reply
        can only lower that.  The mount's own backing device takes a larger window through
        sysfs (root only), once INIT is done: hence here, on a first request.  Benchmark
        rows 1 and 4 (docs/serving.md)."""
        self._tune_pending = False
        from tensorfs.runtime import mount_device
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
        # ENOSYS once: the kernel then opens files (directories) without asking, keeping
        # their cached pages (listings) across opens.  Writes never get here (`ro`).
        self.lib.fuse_reply_err(req, errno.ENOSYS)

    def _take_buffer(self, size: int):
        with self._buffers_lock:
            if self._buffers and len(self._buffers[-1]) >= size:
                return self._buffers.pop()
        return (ctypes.c_char * max(size, 1 << 20))()

    def _read(self, req, ino, size, offset, fi):
        buf = self._take_buffer(size)
        try:
            n = self.fs.read_into(ino, offset, memoryview(buf).cast("B")[:size])
            self.lib.fuse_reply_buf(req, buf, n)
        finally:
            with self._buffers_lock:
                if len(self._buffers) < 8:
                    self._buffers.append(buf)

    def _readdir(self, req, ino, size, offset, fi, plus=False):
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

    # -- the loop -------------------------------------------------------------------------------
    def serve(self, mountpoint: str, mount_options: list[str], threads: bool = True) -> None:
        """Mount at ``mountpoint`` (a resolved path), serve until unmounted or
        SIGINT/SIGTERM/SIGHUP, unmount."""
        lib = self.lib
        handlers = {"init": self._init, "lookup": self._guarded(self._lookup),
                    "getattr": self._guarded(self._getattr),
                    "open": self._guarded(self._no_open), "opendir": self._guarded(self._no_open),
                    "read": self._guarded(self._read), "readdir": self._guarded(self._readdir),
                    "readdirplus": self._guarded(self._readdirplus),
                    "statfs": self._guarded(self._statfs),
                    "getxattr": self._guarded(self._getxattr),
                    "listxattr": self._guarded(self._listxattr)}
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
        se = lib.fuse_session_new(ctypes.byref(args), ops, ctypes.sizeof(ops), None)
        if not se:
            raise FuseUnavailable(f"libfuse refused the mount options: {','.join(mount_options)}")
        try:
            # libfuse installs its SIGINT/SIGTERM/SIGHUP handlers only where the default is
            # in place; Python's own SIGINT handler would never run while the loop blocks.
            previous = signal.signal(signal.SIGINT, signal.SIG_DFL)
            if lib.fuse_set_signal_handlers(se) != 0:
                raise FuseUnavailable("could not install the FUSE signal handlers")
            try:
                if lib.fuse_session_mount(se, mountpoint.encode("utf-8", "surrogateescape")) != 0:
                    raise FuseUnavailable(f"{mountpoint}: mount failed")
                try:
                    self._loop(se, threads)
                finally:
                    lib.fuse_session_unmount(se)
            finally:
                lib.fuse_remove_signal_handlers(se)
                signal.signal(signal.SIGINT, previous)
        finally:
            lib.fuse_session_destroy(se)

    def _loop(self, se, threads: bool) -> None:
        lib = self.lib
        if not threads:
            lib.fuse_session_loop(se)
        elif hasattr(lib, "fuse_loop_cfg_create"):
            config = lib.fuse_loop_cfg_create()
            try:
                lib.fuse_session_loop_mt_312(se, config)
            finally:
                lib.fuse_loop_cfg_destroy(config)
        else:
            config = _LoopConfig32(0, 10)
            lib.fuse_session_loop_mt_32(se, ctypes.byref(config))
