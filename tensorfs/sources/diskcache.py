"""The disk cache of remote blocks (``--disk-cache DIR[:SIZE]``, docs/reference/remote.md).

DIR is the user's: it may hold anything else of theirs (a home directory, a project).  So the
cache counts, serves and deletes only what it can prove it wrote, and never goes through a
symbolic link (docs/internals/reliability.md "The disk cache"):

- DIR is created 0700 if missing, and refused in one line if it is a symbolic link, not a
  directory, someone else's, or writable by group or others, or if a directory on the way to
  it is someone else's (not root's) or writable by others without being sticky, or a link on
  the way is another user's (``tensorfs.runtime.paths``); it is opened once, and every
  later access goes through that descriptor (``O_NOFOLLOW``), wherever the process's working
  directory is afterwards.
- Everything the cache writes is in one subdirectory of DIR, ``ROOT`` (0700), which holds a
  marker file with the cache's format: a directory of that name without the marker is
  someone else's, refused.  Nothing outside ``ROOT`` is ever listed, opened or removed.
- In ``ROOT``, a block is a file named ``KEY.INDEX`` (KEY: 64 hex digits) that starts with a
  header: magic, format, key, block index, length and a SHA-256 of the header and the bytes.
  A block is served only when its size, header and checksum are right; a block of ours
  (our magic) that fails is removed, logged, and fetched again.  A file that does not start
  with our magic is not ours: never served, counted nor removed.
- A block is written to ``.KEY.INDEX.PID.START.TID.tmp`` and linked into place (``link``
  never replaces a file); a temporary file whose writer (PID, started at START) is gone is
  removed by the next scan, and counted until then.
- SIZE bounds ``ROOT`` as a whole, whatever number of mounts share it: the bytes are kept in
  a ledger in ``ROOT/lock``, updated under ``flock`` by every writer; past SIZE, a scan of
  ``ROOT`` (under the same lock, at most ``MAX_SCAN`` names) removes the least recently used
  blocks (oldest mtime: a block served is touched) until a tenth of SIZE is free.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import re
import stat
import struct
import threading
import time

from tensorfs.runtime.files import write_file
from tensorfs.runtime.paths import open_private_dir, open_private_subdir

log = logging.getLogger("tensorfs")

ROOT = "tensorfs-blocks.v1"         # the cache's own directory in DIR
MARKER = "TENSORFS-DISK-CACHE"
MARKER_TEXT = b"tensorfs disk cache, format 1: every file here is the cache's own\n"
LOCK = "lock"

MAGIC = b"TFSBLOCK"
FORMAT = 1
# magic, format, header size, reserved, key (sha256), index, length, sha256(header + bytes)
_HEADER = struct.Struct("<8sHHI32sQQ32s")
HEADER_SIZE = _HEADER.size
_SIGNED = HEADER_SIZE - 32          # what the checksum covers of the header
MAX_BLOCK = 1 << 30                 # a header's length past this is not a block of ours

_LEDGER = struct.Struct("<8sQQ")    # magic, bytes, blocks
_LEDGER_MAGIC = b"TFSUSED1"
RESERVED = 4096                     # the marker and the ledger, counted as if full

MAX_SCAN = 1 << 17                  # names looked at in one scan of ROOT
MAX_BLOCKS = MAX_SCAN // 2          # blocks kept, at most: each of them is seen by a scan
LOCK_WAIT_S = 2.0                   # a block not kept beats a read held up by another mount
MAX_BAD_LOGGED = 20                 # lines about bad blocks per process

_BLOCK_NAME = re.compile(r"([0-9a-f]{64})\.([0-9]{1,19})")
_TEMP_NAME = re.compile(r"\.([0-9a-f]{64}\.[0-9]{1,19})\.([0-9]{1,10})\.([0-9]{1,20})\.([0-9]{1,20})\.tmp")

# runtime.files.write_file's temporary name for the marker, while another mount writes it
_MARKER_TEMP = re.compile(r"\." + MARKER + r"\.[0-9]+\.[0-9]+\.tmp")
MARKER_TRIES = 200

_OPEN_FILE = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK


class DiskCacheError(PermissionError):
    """DIR cannot be used: said in one line at mount."""


def object_key(identity: str, version: str, block_size: int) -> str:
    """The key of one object's blocks: ``identity`` names the endpoint and the path
    (``Transport.identity``), ``version`` the bytes, ``block_size`` how they are cut."""
    text = f"{identity}\0{version}\0{block_size}"
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def _started(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot, or None if there is none:
    with the pid, it names one process for the life of the machine."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        if fields[0] in (b"Z", b"X"):
            return None
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


class DiskCache:
    """Blocks of remote files on disk under ``directory``/``ROOT``, at most ``max_bytes`` of
    them for all the mounts that share it.  ``get``/``get_into`` serve a verified block or
    nothing; ``put`` keeps one, or silently does not (a full disk, a busy lock)."""

    _fd = -1        # until the directory is open (``__del__`` of one that failed to open)

    def __init__(self, directory: str, max_bytes: int):
        self.directory = os.path.abspath(directory)     # where the command ran (docs/reference/remote.md)
        self.max_bytes = max_bytes
        self._limit = max_bytes - RESERVED
        self._target = self._limit - self._limit // 10
        self._euid = os.geteuid()
        dir_fd = open_private_dir(self.directory, self._euid, _refused)
        try:
            self._fd = _open_root(dir_fd, self.directory, self._euid)     # ROOT: all we use
        finally:
            os.close(dir_fd)
        self.root = os.path.join(self.directory, ROOT)
        self._lock = threading.Lock()
        self._lock_fd: int | None = None
        self._lock_pid = 0
        self._labels: dict[str, str] = {}
        self._bad_logged = 0
        self._started_pid, self._started = 0, 0
        self._scan_truncated_logged = False
        try:
            with self._locked(wait=None) as locked:
                if locked:
                    self._write_ledger(*self._scan())
        except OSError as error:
            self.close()
            raise _refused(self.root, f"cannot read it: {error.strerror}") from None

    # -- keys ------------------------------------------------------------------------------
    object_key = staticmethod(object_key)

    def key(self, identity: str, version: str, block_size: int, label: str | None = None) -> str:
        """``object_key``, remembering ``label`` (the file as shown) for the log."""
        key = object_key(identity, version, block_size)
        if label is not None:
            self._labels[key] = label
        return key

    # -- reading ---------------------------------------------------------------------------
    def get(self, key: str, index: int, length: int) -> bytearray | None:
        if not 0 < length <= MAX_BLOCK:
            return None
        buf = bytearray(length)
        return buf if self.get_into(key, index, buf) else None

    def get_into(self, key: str, index: int, buf) -> bool:
        """Fill ``buf`` (exactly the block's length) with block ``index`` of ``key`` if a
        block of ours with the right header and checksum is there; else False (a bad block of
        ours is removed on the way and logged)."""
        length = len(buf)
        name = _block_name(key, index)
        if name is None or not 0 < length <= MAX_BLOCK:
            return False
        try:
            fd = os.open(name, os.O_RDONLY | _OPEN_FILE, dir_fd=self._fd)
        except OSError:
            return False            # not there, or a symbolic link (ELOOP): not ours
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != self._euid:
                return False
            head = bytearray(HEADER_SIZE)
            if st.st_size != HEADER_SIZE + length:
                # read no more than a header of a file of the wrong size: ours (then bad) or not
                if os.preadv(fd, [head], 0) == HEADER_SIZE and _ours(head):
                    self._bad(name, st, index, key, f"{st.st_size} bytes, not "
                                                    f"{HEADER_SIZE + length}")
                return False
            with memoryview(buf) as view:
                got = os.preadv(fd, [head, view], 0)
            if not _ours(head):
                return False
            why = _check(head, buf, got, key, index, length)
            if why is not None:
                self._bad(name, st, index, key, why)
                return False
            try:
                os.utime(fd)            # served: the newest, for every mount's eviction
            except OSError:
                pass
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def _bad(self, name: str, st: os.stat_result, index: int, key: str, why: str) -> None:
        """Remove a block of ours that failed its check (the very file that was read: another
        mount may have put a good one in its place since) and say so."""
        try:
            now = os.stat(name, dir_fd=self._fd, follow_symlinks=False)
            if (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev):
                os.unlink(name, dir_fd=self._fd)
        except OSError:
            pass
        if self._bad_logged < MAX_BAD_LOGGED:
            self._bad_logged += 1
            label = self._labels.get(key, f"key {key[:16]}")
            log.warning("%s: disk cache block %d failed its check (%s): removed, fetched "
                        "again (%s)", label, index, why, os.path.join(self.root, name))

    # -- writing ---------------------------------------------------------------------------
    def put(self, key: str, index: int, data) -> None:
        """Keep block ``index`` of ``key``, or silently do not (a full disk, a busy lock, no
        room the bound allows).  Its room is taken before a byte is written: under the lock,
        its temporary file is made at its full size (so that every scan counts it whole) and
        added to the ledger, evicting first if need be; a block that does not fit beside the
        blocks being written by every mount is not kept.  So DIR holds at most SIZE at every
        moment, not only between puts."""
        length = len(data)
        name = _block_name(key, index)
        need = HEADER_SIZE + length
        if name is None or not 0 < length <= MAX_BLOCK or need > self._limit:
            return
        head = _header(key, index, data)
        pid = os.getpid()
        if self._started_pid != pid:
            self._started_pid, self._started = pid, _started(pid) or 0
        tmp = f".{name}.{pid}.{self._started}.{threading.get_ident()}.tmp"
        if not self._reserve(tmp, need):
            return
        kept = False
        try:
            fd = os.open(tmp, os.O_WRONLY | _OPEN_FILE, dir_fd=self._fd)
            try:
                _write_all(fd, head, data)
            finally:
                os.close(fd)
            with self._locked(wait=LOCK_WAIT_S) as locked:
                if not locked:
                    return          # the ledger counts it until the next scan: over, not under
                try:
                    os.link(tmp, name, src_dir_fd=self._fd, dst_dir_fd=self._fd,
                            follow_symlinks=False)
                except FileExistsError:
                    self._release(tmp, need)
                    return          # another mount kept it first (or a file not ours is there)
                _unlink(self._fd, tmp)          # the block's bytes, counted once
                kept = True
                used = self._read_ledger()
                self._write_ledger(*(self._scan() if used is None else (used[0], used[1] + 1)))
        except OSError:
            if not kept:
                with self._locked(wait=LOCK_WAIT_S) as locked:
                    if locked:
                        self._release(tmp, need)
            return                  # a full disk: the block is just not kept
        finally:
            _unlink(self._fd, tmp)

    def _reserve(self, tmp: str, need: int) -> bool:
        """Count ``need`` bytes more in the ledger and make ``tmp`` at that size, under the
        lock, if DIR has room for them within the bound (evicting the oldest blocks for
        them); else make nothing.  The room is found before the file is made: a file made
        first, then removed for want of room, would be over the bound meanwhile."""
        with self._locked(wait=LOCK_WAIT_S) as locked:
            if not locked:
                return False
            try:
                used = self._read_ledger()
                if used is None or used[0] + need > self._limit or used[1] >= MAX_BLOCKS:
                    used = self._scan(need=need)        # evicts to make room for need
                if used[0] + need > self._limit or used[1] >= MAX_BLOCKS:
                    self._write_ledger(*used)
                    return False        # no room beside the blocks being written now
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FILE, 0o600,
                             dir_fd=self._fd)
            except OSError:
                return False
            try:
                try:
                    os.ftruncate(fd, need)      # its full size: any scan counts it whole
                finally:
                    os.close(fd)
            except OSError:
                _unlink(self._fd, tmp)
                return False
            self._write_ledger(used[0] + need, used[1])
            return True

    def _release(self, tmp: str, need: int) -> None:
        """Give back the room ``_reserve`` took for ``tmp`` (the lock held)."""
        _unlink(self._fd, tmp)
        used = self._read_ledger()
        if used is not None:
            self._write_ledger(used[0] - need, used[1])

    # -- the whole directory -----------------------------------------------------------------
    def usage(self) -> tuple[int, int]:
        """(bytes, blocks) of ROOT as a scan finds them now (tests, docs)."""
        with self._locked(wait=None):
            return self._scan(evict=False)

    def _scan(self, evict: bool = True, need: int = 0) -> tuple[int, int]:
        """Count ROOT's blocks and live temporary files, remove the temporary files of dead
        writers and (``evict``) the oldest blocks past the bound, ``need`` bytes more
        counted (a block about to be written).  Called with the lock held.  Returns (bytes,
        blocks) after eviction, without ``need``."""
        blocks: list[tuple[int, str, int, int, int]] = []   # mtime, name, size, ino, dev
        used = 0
        with os.scandir(self._fd) as entries:
            for seen, entry in enumerate(entries):
                if seen >= MAX_SCAN:
                    if not self._scan_truncated_logged:
                        self._scan_truncated_logged = True
                        log.warning("%s: more than %d names: only the first are counted",
                                    self.root, MAX_SCAN)
                    break
                block, temp = _BLOCK_NAME.fullmatch(entry.name), _TEMP_NAME.fullmatch(entry.name)
                if block is None and temp is None:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode) or st.st_uid != self._euid:
                    continue
                if temp is not None:
                    if _writer_gone(int(temp.group(2)), int(temp.group(3))):
                        self._remove(entry.name, st)
                    else:
                        used += st.st_size
                    continue
                verdict = self._header_verdict(entry.name, st)
                if verdict == "ours":
                    blocks.append((st.st_mtime_ns, entry.name, st.st_size, st.st_ino, st.st_dev))
                    used += st.st_size
                elif verdict == "bad":
                    self._remove(entry.name, st)
        count = len(blocks)
        if evict and (used + need > self._limit or count + (need > 0) > MAX_BLOCKS):
            blocks.sort()
            for _, name, size, ino, dev in blocks:
                if used + need <= self._target and count <= MAX_BLOCKS - MAX_BLOCKS // 10:
                    break
                self._remove(name, ino=ino, dev=dev)
                used -= size
                count -= 1
        return used, count

    def _header_verdict(self, name: str, st: os.stat_result) -> str:
        """"ours" (a block of ours, by its header and size), "bad" (our magic, a wrong
        header or size) or "foreign" (not ours: left alone).  Reads the header only."""
        try:
            fd = os.open(name, os.O_RDONLY | _OPEN_FILE, dir_fd=self._fd)
        except OSError:
            return "foreign"
        try:
            now = os.fstat(fd)
            if (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev) or not stat.S_ISREG(now.st_mode):
                return "foreign"
            head = os.pread(fd, HEADER_SIZE, 0)
        except OSError:
            return "foreign"
        finally:
            os.close(fd)
        if not _ours(head):
            return "foreign"
        match = _BLOCK_NAME.fullmatch(name)
        fields = _HEADER.unpack(head)
        if (fields[2] != HEADER_SIZE or fields[4].hex() != match.group(1)
                or fields[5] != int(match.group(2)) or not 0 < fields[6] <= MAX_BLOCK
                or st.st_size != HEADER_SIZE + fields[6]):
            return "bad"
        return "ours"

    def _remove(self, name: str, st: os.stat_result | None = None, *, ino=None, dev=None) -> None:
        """Unlink ``name`` if it is still the file that was looked at (another mount may
        have removed it, or put another there)."""
        if st is not None:
            ino, dev = st.st_ino, st.st_dev
        try:
            now = os.stat(name, dir_fd=self._fd, follow_symlinks=False)
            if (now.st_ino, now.st_dev) == (ino, dev):
                os.unlink(name, dir_fd=self._fd)
        except OSError:
            pass                    # gone already: another mount's eviction

    # -- the lock and the ledger ---------------------------------------------------------------
    def _lock_file(self) -> int:
        """ROOT/lock, opened by this process (a descriptor from before a fork would share its
        lock with the parent)."""
        if self._lock_fd is None or self._lock_pid != os.getpid():
            if self._lock_fd is not None:
                os.close(self._lock_fd)         # the parent's: its lock is not ours
                self._lock_fd = None
            fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | _OPEN_FILE, 0o600, dir_fd=self._fd)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != self._euid:
                os.close(fd)
                raise OSError(errno.EPERM, f"{self.root}/{LOCK}: not a file of the cache's")
            self._lock_fd, self._lock_pid = fd, os.getpid()
        return self._lock_fd

    def _locked(self, wait: float | None):
        return _Held(self, wait)

    def _read_ledger(self) -> tuple[int, int] | None:
        try:
            data = os.pread(self._lock_file(), _LEDGER.size, 0)
        except OSError:
            return None
        if len(data) != _LEDGER.size:
            return None
        magic, used, count = _LEDGER.unpack(data)
        return (used, count) if magic == _LEDGER_MAGIC else None

    def _write_ledger(self, used: int, count: int) -> None:
        try:
            os.pwrite(self._lock_file(), _LEDGER.pack(_LEDGER_MAGIC, max(0, used), max(0, count)), 0)
        except OSError:
            pass

    def close(self) -> None:
        """Let go of the descriptors (later calls keep nothing and serve nothing)."""
        fds = (self._lock_fd, self._fd)
        self._lock_fd, self._fd = None, -1
        for fd in fds:
            if fd is not None and fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def __del__(self):
        if self._fd >= 0:
            self.close()


class _Held:
    """``with cache._locked(wait) as locked``: this process's threads one at a time, and one
    process of all that share ROOT (``flock``).  ``wait`` None: as long as it takes; else at
    most that many seconds, and ``locked`` says whether it was had."""

    def __init__(self, cache: DiskCache, wait: float | None):
        self.cache = cache
        self.wait = wait
        self.held = False
        self.flocked = False

    def __enter__(self) -> bool:
        deadline = None if self.wait is None else time.monotonic() + self.wait
        if not self.cache._lock.acquire(timeout=-1 if self.wait is None else self.wait):
            return False
        self.held = True
        try:
            fd = self.cache._lock_file()
            if deadline is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                pause = 0.001
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            return False
                        time.sleep(pause)
                        pause = min(0.05, pause * 2)
            self.flocked = True
            return True
        except OSError:
            return False

    def __exit__(self, *exc) -> None:
        if self.flocked:
            try:
                fcntl.flock(self.cache._lock_fd, fcntl.LOCK_UN)
            except OSError:
                pass
        if self.held:
            self.cache._lock.release()


# -- the directories ------------------------------------------------------------------------

def _refused(directory: str, why: str) -> DiskCacheError:
    return DiskCacheError(f"{directory}: refused as the disk cache: {why}")


def _open_root(dir_fd: int, directory: str, euid: int) -> int:
    """DIR/ROOT, the cache's own directory: made (0700, with its marker) if missing; refused
    if it is not a private directory of the user's holding the marker, unless it is empty
    (made by a mount that has not written the marker yet)."""
    path = os.path.join(directory, ROOT)
    fd = open_private_subdir(dir_fd, ROOT, euid, _refused, path)
    try:
        for _ in range(MARKER_TRIES):
            marker = _read_marker(fd, euid)
            if marker is not None:
                break
            with os.scandir(fd) as entries:
                names = [e.name for _, e in zip(range(8), entries)]
            if names and all(n in (MARKER, LOCK) or _MARKER_TEMP.fullmatch(n) for n in names):
                time.sleep(0.01)    # another mount is writing the marker now, or just did
                continue
            if names:
                raise _refused(path, f"it is not a tensorfs disk cache (no {MARKER} file in "
                                     "it): move it away or choose another directory")
            try:
                write_file(fd, MARKER, MARKER_TEXT)
            except OSError as error:
                raise _refused(path, f"cannot write its {MARKER} file: {error.strerror}") from None
            marker = MARKER_TEXT
            break
        if marker != MARKER_TEXT:
            raise _refused(path, f"its {MARKER} file is not this version's (or is being "
                                 "written for too long): move it away or choose another "
                                 "directory")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_marker(root_fd: int, euid: int) -> bytes | None:
    try:
        fd = os.open(MARKER, os.O_RDONLY | _OPEN_FILE, dir_fd=root_fd)
    except FileNotFoundError:
        return None
    except OSError:
        return b""                  # a link or worse: not the marker
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != euid:
            return b""
        return os.pread(fd, len(MARKER_TEXT) + 1, 0)
    finally:
        os.close(fd)


# -- blocks -------------------------------------------------------------------------------

def _block_name(key: str, index: int) -> str | None:
    name = f"{key}.{index}"
    return name if index >= 0 and _BLOCK_NAME.fullmatch(name) else None


def _header(key: str, index: int, data) -> bytes:
    fields = _HEADER.pack(MAGIC, FORMAT, HEADER_SIZE, 0, bytes.fromhex(key), index, len(data),
                          bytes(32))[:_SIGNED]
    digest = hashlib.sha256(fields)
    digest.update(data)
    return fields + digest.digest()


def _ours(head) -> bool:
    return len(head) >= 10 and head[:8] == MAGIC and head[8:10] == FORMAT.to_bytes(2, "little")


def _check(head, data, got: int, key: str, index: int, length: int) -> str | None:
    """Why the block read (``got`` bytes) is not block ``index`` of ``key``, or None."""
    if got != HEADER_SIZE + length:
        return f"short read: {got} of {HEADER_SIZE + length} bytes"
    _, _, size, _, k, i, n, checksum = _HEADER.unpack(head)
    if size != HEADER_SIZE or k.hex() != key or i != index or n != length:
        return "a wrong header"
    digest = hashlib.sha256(memoryview(head)[:_SIGNED])
    digest.update(data)
    if digest.digest() != checksum:
        return "checksum mismatch"
    return None


def _write_all(fd: int, head: bytes, data) -> None:
    buffers = [memoryview(head), memoryview(data).cast("B")]
    while buffers:
        n = os.writev(fd, buffers)
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        while buffers and n >= len(buffers[0]):
            n -= len(buffers[0])
            buffers.pop(0)
        if buffers and n:
            buffers[0] = buffers[0][n:]


def _unlink(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _writer_gone(pid: int, started: int) -> bool:
    """Whether the writer of a temporary file, process ``pid`` started at ``started`` ticks,
    is gone (a pid used again by another process is not the writer)."""
    return _started(pid) != started
