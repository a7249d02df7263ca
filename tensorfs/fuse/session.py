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

docs/internals/serving.md has the measurements.  The filesystem object given to ``Session`` answers
in plain Python values (``Entry`` tuples, bytes, counts) and raises ``FsError(errno)`` for a
deliberate answer; ``errno_of`` (also given) turns any other exception into an errno, so
the mapping of errors lives with the filesystem, not here.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import os
import signal
import stat
import threading
import time

from tensorfs.fuse.abi import (
    BACKING_STACKED_OVER,
    CALLBACK_TYPES,
    FI_KEEP_CACHE,
    FI_NOFLUSH,
    FUSE_BUF_FD_SEEK,
    FUSE_BUF_IS_FD,
    FUSE_CAP_PARALLEL_DIROPS,
    FUSE_CAP_PASSTHROUGH,
    FUSE_CAP_READDIRPLUS_AUTO,
    FUSE_CAP_SPLICE_WRITE,
    FUSE_SET_ATTR_GID,
    FUSE_SET_ATTR_MODE,
    FUSE_SET_ATTR_SIZE,
    FUSE_SET_ATTR_UID,
    INTERRUPT_FUNC,
    OPS_SLOTS,
    ROOT_INO,
    EntryParam,
    FileInfo,
    ForgetData,
    FuseArgs,
    FuseBufvec,
    LoopConfig32,
    Stat,
    Statvfs,
)
from tensorfs.fuse.loader import FuseUnavailable, describe, libfuse, libfuse_said
from tensorfs.fuse.operations import Entry, FsError, Later
from tensorfs.fuse.options import MountOptions
from tensorfs.fuse.requesters import Requesters
from tensorfs.runtime import descriptor_of, mount_device

log = logging.getLogger("tensorfs")

# An edit's reply waits this long, at most, for the kernel to forget what the edit changed
# (Session.invalidate).
INVALIDATE_WAIT_S = 2.0

# How the bytes of a local file reach the kernel (``Session.mechanism``, logged once).
PASSTHROUGH, SPLICE, COPY = "passthrough", "splice", "copy"


# Background requests (page-cache reads) the kernel sends at once: the INIT answer's
# max_background (a mount by a user who is not root gets at most the kernel's
# max_user_bgreq).
MAX_BACKGROUND = 64

# "." and "..": a name and a type, never attributes (the kernel knows both directories).
_DOTS = ((b".", Entry(ROOT_INO, True, None, 2)), (b"..", Entry(ROOT_INO, True, None, 2)))


class Session:
    """One mount served by libfuse's loop, calling into ``fs``.

    ``fs`` is a ``tensorfs.fuse.operations.Operations``: its methods, documented there, answer
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
    copied through ``read_into`` whatever the mechanism; one whose bytes are on their way
    (a remote file's) is answered later, holding no thread (``_defer``).
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
        # requests answered later (``Later``): key -> the Later; no libfuse thread waits
        self._waiting: dict[int, Later] = {}
        self._waiting_lock = threading.Lock()
        self._waiting_keys = itertools.count(1)
        self._waits_ended = False
        self._on_interrupt = INTERRUPT_FUNC(self._interrupted)     # kept: libfuse calls it
        self.requesters = Requesters()          # the callers of those requests, watched
        # An editable mount's inodes the kernel holds: ino -> its lookups not yet forgotten
        # (each entry answered counts one; FORGET takes them back).  A version of files/
        # or metadata.json replaced by an edit is kept while the kernel holds it.
        self._lookups: dict[int, int] = {}
        self._lookups_lock = threading.Lock()

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
        (-27 % daemon CPU per GiB read, docs/internals/serving.md).  One extra Ensure, never released,
        on the first call from each libfuse thread keeps the state.  That is only sound while
        libfuse keeps its workers: ``_loop`` makes sure it never destroys an idle one."""
        pinned, answer_error = self._pinned, self._answer_error

        def callback(req, *args):
            if not getattr(pinned, "yes", False):
                ctypes.pythonapi.PyGILState_Ensure()
                pinned.yes = True
                self._live = True
                if self._tune_pending:          # the first request after INIT is some
                    self._raise_read_ahead()    # thread's first: no check on the hot path
            try:
                method(req, *args)
            except BaseException as exc:        # an unanswered request would hang its caller
                answer_error(req, exc)
        return callback

    def _answer_error(self, req, exc: BaseException) -> None:
        """Answer ``req`` with the errno of ``exc``: an ``FsError``'s own, else the one
        ``errno_of`` maps it to (and maybe logs)."""
        self.lib.fuse_reply_err(req, exc.errno if isinstance(exc, FsError) else self.errno_of(exc))

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
        # Reads through the page cache are the kernel's background requests, at most
        # max_background at once (12 by default): with reads that wait without a thread
        # (``_defer``), a dozen slow remote reads would otherwise hold back every other read.
        conn.contents.max_background = MAX_BACKGROUND
        conn.contents.congestion_threshold = MAX_BACKGROUND * 3 // 4
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
        rows 1 and 4 (docs/internals/serving.md)."""
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
        self._looked_up(entry.ino)
        if self.lib.fuse_reply_entry(req, self._entry_param(entry)) != 0:
            self._forgotten(entry.ino, 1)       # the caller is gone: the kernel took none

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
                                ino, libfuse_said["error"] or "no reason given",
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
        self._read_through(req, size, lambda buf: self.fs.read_into(ino, offset, buf))

    def _read_through(self, req, size: int, read) -> None:
        """Answer a read with what ``read(buffer)`` copies into a reply buffer: the count,
        or a ``Later`` of it (the bytes are on their way: the request is kept, no thread
        waits, and the buffer goes with it until the answer, ``_defer``)."""
        buf = self._take_buffer(size)
        kept = True
        try:
            n = read(memoryview(buf).cast("B")[:size])
            if isinstance(n, Later):
                kept = False            # filled by whoever settles it; not reused before

                def reply(count: int) -> None:
                    self.lib.fuse_reply_buf(req, buf, count)
                    self._keep_buffer(buf)

                self._defer(req, n, reply)
            else:
                self.lib.fuse_reply_buf(req, buf, n)
        finally:
            if kept:
                self._keep_buffer(buf)

    def _keep_buffer(self, buf) -> None:
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
        counted: list[int] = []         # entries with attributes: a lookup each (not . and ..)
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
            if plus and e.ino and index >= 2 and self.editable:
                counted.append(entry.ino)
        for counted_ino in counted:
            self._looked_up(counted_ino)
        if self.lib.fuse_reply_buf(req, buf, used) != 0:
            for counted_ino in counted:
                self._forgotten(counted_ino, 1)

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
        value = self.fs.getxattr(ino, name.decode("utf-8", "surrogateescape"))
        if isinstance(value, Later):
            self._defer(req, value, lambda data: self._reply_sized(req, data, size))
        else:
            self._reply_sized(req, value, size)

    # -- answers that come later: the request is kept, no thread waits -------------------------
    def _defer(self, req, later: Later, reply) -> None:
        """Answer ``req`` with ``reply(value)`` once ``later`` is settled, from the thread that
        settles it; the libfuse thread that asked returns now.  An INTERRUPT of the request
        (its caller got a signal or was killed), or its caller's thread gone (watched by
        ``requesters``: the kernel interrupts no read through the page cache) answers EINTR
        and tells the ``Later``'s owner (``give_up``); a session that ends answers ECANCELED
        (``_end_waits``).  Each request is answered once: the first of these takes it out
        of ``_waiting``, and every reply is sent under ``_waiting_lock``, so none is sent
        once the session is gone."""
        key = next(self._waiting_keys)
        ctx = self.lib.fuse_req_ctx(req)
        pid = ctx.contents.pid if ctx else 0
        with self._waiting_lock:
            ended = self._waits_ended
            if ended:
                self.lib.fuse_reply_err(req, errno.ECANCELED)
            else:
                self._waiting[key] = later
        if ended:
            later.give_up(errno.ECANCELED)          # its owner stops waiting for a reply
            return

        def deliver(ok: bool, value) -> None:
            self.requesters.forget(key)
            with self._waiting_lock:
                if self._waiting.pop(key, None) is None:
                    return
                try:
                    if not ok:
                        raise value
                    reply(value)
                except BaseException as exc:
                    self._answer_error(req, exc)

        # Registered before any reply can free the request.  If it was interrupted already,
        # libfuse calls _interrupted from inside this call, holding no reference of its own:
        # a reply sent there would free the request under libfuse's feet.  None is, because
        # the delivery is handed over only after (an INTERRUPT read later is called with a
        # reference held, and may reply).
        self.lib.fuse_req_interrupt_func(req, self._on_interrupt, key)
        self.requesters.watch(key, pid, lambda: self._gone(key, pid))
        later.deliver_to(deliver)

    def _gone(self, key: int, pid: int) -> None:
        with self._waiting_lock:
            later = self._waiting.get(key)
        if later is not None:
            log.debug("request %d: its caller (thread %d) is gone: answered EINTR", key, pid)
            later.give_up(errno.EINTR)

    def _interrupted(self, req, key) -> None:
        with self._waiting_lock:
            later = self._waiting.get(key or 0)
        if later is not None:
            log.debug("request %d interrupted: answered EINTR", key)
            try:
                later.give_up(errno.EINTR)
            except Exception:                   # called by libfuse: nothing above to raise to
                log.exception("an interrupted request's work could not be told")

    def _end_waits(self) -> None:
        """The session is ending: every request still waiting is answered ECANCELED, before
        libfuse lets go of them; a ``Later`` settled afterwards answers nothing."""
        with self._waiting_lock:
            self._waits_ended = True
            waiting = list(self._waiting.values())
        self.requesters.forget_all()
        for later in waiting:
            later.give_up(errno.ECANCELED)
        with self._waiting_lock:            # a reply being sent by another thread is done
            self._waiting.clear()

    def _listxattr(self, req, ino, size):
        names = self.fs.listxattr(ino)
        self._reply_sized(req, b"".join(n.encode() + b"\0" for n in names), size)

    # -- an editable mount (--edits) ------------------------------------------------------------
    # The kernel's lookups of an editable mount's inodes: counted from each entry answered
    # (LOOKUP, CREATE, an entry of READDIRPLUS with attributes), taken back by FORGET.  A
    # read-only mount's tree never changes: libfuse answers its FORGETs (no slot set).
    def _looked_up(self, ino: int) -> None:
        if self.editable and ino:
            with self._lookups_lock:
                self._lookups[ino] = self._lookups.get(ino, 0) + 1

    def _forgotten(self, ino: int, nlookup: int) -> None:
        with self._lookups_lock:
            left = self._lookups.get(ino, 0) - nlookup
            if left > 0:
                self._lookups[ino] = left
                return
            self._lookups.pop(ino, None)
        log.debug("inode %d: forgotten by the kernel", ino)
        self.fs.forget(ino)

    def kernel_holds(self, ino: int) -> bool:
        """Whether the kernel may still send requests for ``ino`` (an editable mount's: it
        has lookups of it not yet forgotten)."""
        with self._lookups_lock:
            return ino in self._lookups

    def _forget(self, req, ino, nlookup) -> None:
        """FORGET: no answer but ``fuse_reply_none``, whatever happens."""
        try:
            self._forgotten(ino, nlookup)
        except Exception:                       # called by libfuse: nothing above to raise to
            log.exception("a FORGET of inode %d could not be taken", ino)
        finally:
            self.lib.fuse_reply_none(req)

    def _forget_multi(self, req, count, forgets) -> None:
        try:
            items = ctypes.cast(forgets, ctypes.POINTER(ForgetData))
            for i in range(count):
                self._forgotten(items[i].ino, items[i].nlookup)
        except Exception:                       # as _forget
            log.exception("a FORGET of %d inodes could not be taken", count)
        finally:
            self.lib.fuse_reply_none(req)

    def _edit_handlers(self) -> dict:
        """Opens with a handle (a reader's snapshot, a writer's buffer), reads through it, and
        the calls that change the tree.  Every change is checked against the mount's owner:
        under allow_other another user may read, never edit."""
        g = self._guarded
        return {"open": g(self._open_editable), "read": g(self._read_editable),
                "write": g(self._write), "flush": g(self._flush), "fsync": g(self._fsync),
                "release": g(self._release),
                "create": g(self._create), "setattr": g(self._setattr),
                "unlink": g(self._unlink), "rmdir": g(self._rmdir), "rename": g(self._rename),
                "setxattr": g(self._setxattr),
                "forget": self._forget, "forget_multi": self._forget_multi}

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
        fh = self._fh(fi)
        self._read_through(req, size, lambda buf: self.fs.read_handle(ino, fh, offset, buf))

    def _write(self, req, ino, data, size, offset, fi):
        n = self.fs.write(ino, self._fh(fi), offset, ctypes.string_at(data, size))
        self.lib.fuse_reply_write(req, n)

    def _flush(self, req, ino, fi):
        self.fs.flush(ino, self._fh(fi))
        self.lib.fuse_reply_err(req, 0)

    def _fsync(self, req, ino, datasync, fi):
        self.fs.fsync(ino, self._fh(fi))
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
        self._looked_up(entry.ino)
        if self.lib.fuse_reply_create(req, self._entry_param(entry), fi) != 0:
            self._forgotten(entry.ino, 1)

    def _setattr(self, req, ino, attr, to_set, fi):
        if to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID):
            # modes and owners are the mount's: setting them to what they are is answered
            # (sed -i and vim give their new file the old one's), any change refused
            asked, now = ctypes.cast(attr, ctypes.POINTER(Stat)).contents, Stat()
            self._fill_stat(now, self.fs.getattr(ino, self._fh(fi)))
            if (to_set & FUSE_SET_ATTR_MODE and asked.st_mode & 0o7777 != now.st_mode & 0o7777
                    or to_set & FUSE_SET_ATTR_UID and asked.st_uid != now.st_uid
                    or to_set & FUSE_SET_ATTR_GID and asked.st_gid != now.st_gid):
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
        libfuse_said["error"] = None
        se = lib.fuse_session_new(ctypes.byref(args), ops, ctypes.sizeof(ops), None)
        if not se:
            raise FuseUnavailable(libfuse_said["error"] or
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
                    raise FuseUnavailable(libfuse_said["error"] or f"{mountpoint}: mount failed")
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
                    self._end_waits()
                    lib.fuse_session_unmount(se)
            finally:
                lib.fuse_remove_signal_handlers(se)
                signal.signal(signal.SIGINT, previous)
        finally:
            self._se = None
            lib.fuse_session_destroy(se)
        # The loop returns 0 (unmounted), the signal that ended it, or -errno.
        if code < 0 or (code == 0 and not self._live):
            reason = libfuse_said["error"] or (os.strerror(-code) if code < 0 else "unmounted")
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
        # flat, docs/internals/serving.md).  So none is destroyed: the pool stays at the most requests
        # ever in flight at once.  INT_MAX, the largest value libfuse reads as an int:
        # UINT_MAX would compare as -1 and destroy every worker after each request.
        config = LoopConfig32(0, 2**31 - 1)
        return lib.fuse_session_loop_mt_32(se, ctypes.byref(config))
