"""The edit store of ``--edits DIR``: what a user changed in a mounted model, kept on disk so
that a later mount of the same model serves the same edits (docs/reference/editing.md).

DIR is the user's, as the disk cache's is (``tensorfs.sources.diskcache``): created 0700 if missing,
refused in one line if it is a symbolic link, not a directory, someone else's or writable by
group or others.  Everything the store writes is in one subdirectory of DIR, ``ROOT``, which
holds a marker file; nothing outside it is ever listed, opened or removed.  In ``ROOT``:

- ``edits.json``, the journal: the source's identity (each file's format, size and the
  SHA-256 of its header), the metadata edits (key -> type and value, or deleted; new keys
  in the order they were added), the tensor edits (original name -> new name or removed,
  and the file holding its new bytes), and the name of its log.  It is replaced whole
  (written to a temporary name, fsynced, renamed over, the directory fsynced) when the log
  has grown past the journal's own size (and 64 KiB): a daemon killed at any moment leaves
  the old journal or the new one.
- ``edits-*.log``, the log the journal names: one line of JSON per edit since the journal
  was written (what the edit set and unset), appended and fsynced, so that an edit costs
  in proportion to the edit, not to the edits before it.  A line that fails part-way (the
  disk full) is cut off again before the edit is refused, so a line is there whole or not
  at all.  A last line cut short all the same (a daemon killed while writing it: the edit
  was never answered) is dropped at the next mount, and so are the beginnings of lines
  that an earlier version left before the next line (``_after_fragments``).
- ``data-*.bin``: a tensor's replacement bytes, one file per replacement, written the same
  way before the journal names it.  A file the journal does not name (a replacement
  superseded, or written by a daemon killed before its journal) is removed when the store
  is opened.

The journal binds DIR to one model: a mount of another model with the same DIR is refused in
one line.  Nothing here knows about FUSE or about the tree.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass, field

from tensorfs.runtime.claims import claim, release
from tensorfs.runtime.files import write_file
from tensorfs.runtime.paths import NotOwnFile, open_own_file, open_private_dir, open_private_subdir
from tensorfs.sources.source import Source

ROOT = "tensorfs-edits.v1"
MARKER = "TENSORFS-EDITS"
MARKER_TEXT = b"tensorfs edits, format 1: every file here is tensorfs's own\n"
JOURNAL = "edits.json"
FORMAT = 1
_DATA_NAME = re.compile(r"data-[0-9a-f]{32}\.bin")
_LOG_NAME = re.compile(r"edits-[0-9a-f]{16}\.log")
# The log is folded into the journal once it is larger than this and than the journal.
LOG_FOLD = 64 << 10
_TEMP_NAME = re.compile(r"\.(edits\.json|data-[0-9a-f]{32}\.bin)\.[0-9]+\.[0-9]+\.tmp")


class EditsError(PermissionError):
    """DIR cannot be used, or belongs to another model: said in one line at mount."""


@dataclass(frozen=True)
class TensorEdit:
    """What became of one tensor of the source (keyed by its original name): ``name`` its
    name now (None: removed), ``data`` the store's file holding its new bytes (None: its
    bytes are the source's)."""
    name: str | None
    data: str | None = None


@dataclass(frozen=True)
class EditState:
    """Every edit of one model.  ``metadata``: key -> (type name, JSON-ready value) for a
    key set or added, None for a key deleted; in order (keys new to the model are appended
    in this order).  ``tensors``: original name -> ``TensorEdit``.  Never changed in place:
    an edit makes a new state (``with_metadata``, ``with_tensor``), so that whoever holds
    one (a reader of the composed file) keeps a consistent view."""
    metadata: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.metadata and not self.tensors

    def with_metadata(self, key: str, typed: tuple[str, object] | None) -> EditState:
        metadata = dict(self.metadata)
        metadata[key] = typed
        return EditState(metadata, self.tensors)

    def without_metadata(self, key: str) -> EditState:
        metadata = dict(self.metadata)
        metadata.pop(key, None)
        return EditState(metadata, self.tensors)

    def with_tensor(self, original: str, edit: TensorEdit | None) -> EditState:
        tensors = dict(self.tensors)
        if edit is None:
            tensors.pop(original, None)
        else:
            tensors[original] = edit
        return EditState(self.metadata, tensors)

    def delta_to(self, new: EditState) -> dict | None:
        """What turns this state into ``new``, as one log line holds it (``apply``); None
        where a delta cannot say it (keys reordered): the journal is then written whole."""
        unset = [k for k in self.metadata if k not in new.metadata]
        changed = {k: v for k, v in new.metadata.items()
                   if k not in self.metadata or self.metadata[k] != v}
        tensors = {k: e for k, e in new.tensors.items() if self.tensors.get(k) != e}
        untensors = [k for k in self.tensors if k not in new.tensors]
        delta = {"unset": unset,
                 **EditState(changed, tensors).to_json(), "untensors": untensors}
        if list(self.apply(delta).metadata) != list(new.metadata):
            return None
        return delta

    def apply(self, delta: dict) -> EditState:
        """This state with one log line's delta applied (``ValueError`` on a bad line)."""
        unset, untensors = delta.get("unset", []), delta.get("untensors", [])
        if not (isinstance(unset, list) and isinstance(untensors, list)
                and all(isinstance(k, str) for k in unset + untensors)):
            raise ValueError("a log line's unset or untensors is not a list of names")
        part = EditState.from_json(delta)
        metadata = dict(self.metadata)
        for key in unset:
            metadata.pop(key, None)
        metadata.update(part.metadata)
        tensors = dict(self.tensors)
        for key in untensors:
            tensors.pop(key, None)
        tensors.update(part.tensors)
        return EditState(metadata, tensors)

    def to_json(self) -> dict:
        return {"metadata": {k: (None if v is None else {"type": v[0], "value": v[1]})
                             for k, v in self.metadata.items()},
                "tensors": {k: {"name": e.name, "data": e.data} for k, e in self.tensors.items()}}

    @staticmethod
    def from_json(doc: dict) -> EditState:
        """The state a journal holds; ``ValueError`` (one line) for any entry not of the
        shape ``to_json`` writes.  What the entries mean for the model (its keys, tensors,
        types and sizes) is checked by the one who knows the model (``Editor``)."""
        metadata_doc = _object(doc.get("metadata", {}), "metadata")
        tensors_doc = _object(doc.get("tensors", {}), "tensors")
        metadata: dict[str, tuple[str, object] | None] = {}
        for key, v in metadata_doc.items():
            if v is None:
                metadata[key] = None
                continue
            if not isinstance(v, dict) or set(v) != {"type", "value"} \
                    or not isinstance(v["type"], str):
                raise ValueError(f"metadata {key!r}: not null nor {{\"type\": T, \"value\": V}}")
            metadata[key] = (v["type"], v["value"])
        tensors = {}
        for original, v in tensors_doc.items():
            if not isinstance(v, dict) or set(v) != {"name", "data"}:
                raise ValueError(f"tensor {original!r}: not {{\"name\": N, \"data\": D}}")
            name, data = v["name"], v["data"]
            if name is not None and not isinstance(name, str):
                raise ValueError(f"tensor {original!r}: its name {name!r} is not a string")
            if data is not None and (not isinstance(data, str) or not _DATA_NAME.fullmatch(data)):
                raise ValueError(f"tensor {original!r}: {data!r} is not a data file of the store")
            if name is None and data is not None:
                raise ValueError(f"tensor {original!r}: removed, yet given new bytes")
            tensors[original] = TensorEdit(name, data)
        return EditState(metadata, tensors)


def _object(value, what: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"its {what} is not an object")
    return value


def _no_duplicates(pairs) -> dict:
    """A JSON object, refused if it names one key twice (json keeps the last silently)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"{key!r} appears twice")
        out[key] = value
    return out


_LINE_START = b'{"unset":'


def _after_fragments(line: bytes) -> dict | None:
    """The whole log line at the end of ``line``, where ``line`` is the beginnings of lines
    never answered, then that line: what a disk that filled in the middle of an append left
    before the append was made whole or nothing (the next edit was appended after the
    beginning).  Each line starts ``{"unset":``; nowhere else does that text stand outside
    a string but where a metadata key is named "unset", and that never parses to the end.
    None where ``line`` is not of that shape."""
    at = len(line)
    while True:
        at = line.rfind(_LINE_START, 1, at)
        if at < 0:
            return None
        first = line[:at]                   # the first beginning: up to the next "{"
        brace = first.find(b"{", 1)
        first = first if brace < 0 else first[:brace]
        if not (first.startswith(_LINE_START) or _LINE_START.startswith(first)):
            return None
        try:
            delta = json.loads(line[at:], object_pairs_hook=_no_duplicates)
        except (ValueError, RecursionError):
            continue
        return delta if isinstance(delta, dict) else None


def source_identity(model, sources) -> list[dict]:
    """What binds DIR to a model: each file's name, format, size and header's SHA-256."""
    out = []
    for f in model.files:
        header = sources[f.path].read(0, f.header_size)
        out.append({"name": os.path.basename(f.path), "format": f.format, "size": f.file_size,
                    "header_sha256": hashlib.sha256(header).hexdigest()})
    return out


def _refused(directory: str, why: str) -> EditsError:
    return EditsError(f"{directory}: refused as the edits directory: {why}")


def _fsync_dir(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError:
        pass


class DataFile(Source):
    """One replacement's bytes, open for reading: a ``Source`` (a tensor's raw file and its
    ``.npy`` read it as they read a model file).  The descriptor outlives a later
    replacement (its file is removed, a reader of an earlier composition still reads it)."""

    name: str
    size: int

    def __init__(self, fd: int, size: int, name: str):
        self.fd = fd
        self.size = size
        self.name = name

    def read_into(self, offset: int, buf, span: tuple[int, int] | None = None) -> int:
        # ``span``: a hint for a remote file's read-ahead, of no use to a local file
        return _pread_into(self.fd, offset, buf)

    def read(self, offset: int, size: int) -> bytes:
        size = max(0, min(size, self.size - offset))
        return os.pread(self.fd, size, offset) if size else b""

    def stat(self) -> os.stat_result:
        return os.fstat(self.fd)

    @property
    def local_fd(self) -> int:
        return self.fd

    def __del__(self):
        try:
            os.close(self.fd)
        except (OSError, AttributeError, TypeError):
            pass


def _pread_into(fd: int, offset: int, buf) -> int:
    """Fill ``buf`` from ``fd`` at ``offset``; fewer bytes only at the end of the file."""
    total = 0
    while total < len(buf):
        n = os.preadv(fd, [buf[total:]], offset + total)
        if n == 0:
            break
        total += n
    return total


class PendingData:
    """A replacement's bytes while they are written: a temporary file of the store.  Its
    writer reads them back (``read_into``) before they are kept."""

    def __init__(self, dir_fd: int, fd: int, tmp: str, name: str):
        self._dir_fd, self.fd, self.name = dir_fd, fd, name
        self._tmp: str | None = tmp
        self._kept_from: str | None = None
        self.size = 0

    def pwrite(self, offset: int, data) -> int:
        view = memoryview(data)
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], offset + done)
        self.size = max(self.size, offset + done)
        return done

    def read_into(self, offset: int, buf) -> int:
        """The bytes written so far at ``offset`` into ``buf``: how many (fewer at the
        end); a hole reads as zeros."""
        return _pread_into(self.fd, offset, buf[:max(0, min(len(buf), self.size - offset))])

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)
        self.size = size

    def keep(self) -> str:
        """Fsynced and renamed into place: the name of its file (``unkeep`` takes it back
        where the edit is then not kept)."""
        os.fsync(self.fd)
        os.rename(self._tmp, self.name, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
        _fsync_dir(self._dir_fd)
        self._kept_from, self._tmp = self._tmp, None
        return self.name

    def unkeep(self) -> None:
        """Back to a temporary file (its edit refused: the disk full), still written."""
        tmp = self._kept_from
        if tmp is None:
            return
        try:
            os.rename(self.name, tmp, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
            self._tmp = tmp
        except OSError:
            try:
                os.unlink(self.name, dir_fd=self._dir_fd)
            except OSError:
                pass
        self._kept_from = None
        _fsync_dir(self._dir_fd)

    def drop(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1
        if self._tmp is not None:
            try:
                os.unlink(self._tmp, dir_fd=self._dir_fd)
            except OSError:
                pass
            self._tmp = None


class EditStore:
    """The edits of one model in ``directory``/``ROOT``.  ``state`` is the current
    ``EditState``; ``commit`` replaces it (and the journal) at once."""

    def __init__(self, directory: str, identity: list[dict]):
        self.directory = os.path.abspath(directory)
        self.root = os.path.join(self.directory, ROOT)
        self._euid = os.geteuid()
        self._lock = threading.Lock()
        self._data: dict[str, DataFile] = {}
        self._log: str | None = None        # the log's name (None: no journal written yet)
        self._log_fd: int | None = None
        self._log_size = 0
        self._log_torn = False              # a failed append could not be cut back: fold next
        self._journal_size = 0
        dir_fd = self._open_user_dir()
        try:
            self._fd = self._open_root(dir_fd)
        finally:
            os.close(dir_fd)
        self._owner = -1
        try:
            self._owner = claim(self._fd, self.directory, _refused)   # one mount at a time
            self.state = self._load(identity)
            self._remove_strays()
        except BaseException:
            release(self._owner)
            os.close(self._fd)
            raise

    # -- opening ---------------------------------------------------------------------------
    def _open_user_dir(self) -> int:
        # DIR and the whole way to it checked as the disk cache's is: nothing created through
        # a directory or a link another user controls (runtime.open_private_dir)
        return open_private_dir(self.directory, self._euid, _refused)

    def _open_root(self, dir_fd: int) -> int:
        path = self.root
        fd = open_private_subdir(dir_fd, ROOT, self._euid, _refused, path)
        try:
            marker = self._read(fd, MARKER, 4096)
        except BaseException:
            os.close(fd)
            raise
        if marker is None:
            names = os.listdir(fd)
            if names:
                os.close(fd)
                raise _refused(path, f"it is not a tensorfs edits directory (no {MARKER} file "
                                     "in it): move it away or choose another directory")
            try:
                self._write(fd, MARKER, MARKER_TEXT)
            except OSError as error:
                os.close(fd)
                raise _refused(path, f"cannot write its {MARKER} file: {error.strerror}") \
                    from None
        elif marker != MARKER_TEXT:
            os.close(fd)
            raise _refused(path, f"its {MARKER} file is not tensorfs's (another format?)")
        return fd

    def _read(self, dir_fd: int, name: str, limit: int) -> bytes | None:
        """A file of the store's, whole (None: there is none), checked first: a regular file
        of the user's, of at most ``limit`` bytes, opened without blocking (``open_own_file``);
        anything else is refused in one line."""
        try:
            fd = open_own_file(dir_fd, name, self._euid, limit=limit)
        except FileNotFoundError:
            return None
        except NotOwnFile as why:
            raise _refused(self.root, f"its {why}") from None
        except OSError as error:
            raise _refused(self.root, f"its {name} cannot be opened: {error.strerror}") from None
        try:
            parts, total = [], 0
            while total <= limit:
                part = os.read(fd, limit + 1 - total)
                if not part:
                    break
                parts.append(part)
                total += len(part)
            return b"".join(parts)
        except OSError as error:
            raise _refused(self.root, f"its {name} cannot be read: {error.strerror}") from None
        finally:
            os.close(fd)

    def _load(self, identity: list[dict]) -> EditState:
        data = self._read(self._fd, JOURNAL, 1 << 30)
        if data is None:
            self._identity = identity
            return EditState()
        try:
            doc = _object(json.loads(data, object_pairs_hook=_no_duplicates), "top level")
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, not {FORMAT}")
            state = EditState.from_json(doc)
            recorded = doc["source"]
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
            raise _refused(self.root, f"its {JOURNAL} cannot be read: {error}") from None
        if recorded != identity:
            names = ", ".join(f["name"] for f in recorded) if isinstance(recorded, list) else "?"
            raise _refused(self.directory, f"it holds the edits of another model ({names}); "
                                           "choose another directory for this one")
        self._identity = identity
        self._journal_size = len(data)
        log = doc.get("log")
        if log is not None:
            if not isinstance(log, str) or not _LOG_NAME.fullmatch(log):
                raise _refused(self.root, f"its {JOURNAL} names {log!r}, not a log of the store")
            self._log = log
            state = self._replay_log(state, log)
        return state

    def _replay_log(self, state: EditState, log: str) -> EditState:
        data = self._read(self._fd, log, 1 << 30) or b""
        lines = data.split(b"\n")
        if lines[-1]:
            # a last line cut short: an edit never answered (the daemon died writing it, or
            # the disk filled and cutting it off failed too): dropped
            try:
                fd = open_own_file(self._fd, log, self._euid, os.O_WRONLY)
                try:
                    os.ftruncate(fd, len(data) - len(lines[-1]))
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except (OSError, NotOwnFile) as error:
                raise _refused(self.root, f"its {log} ends in a line cut short, which cannot "
                                          f"be cut off: {error}") from None
        for number, line in enumerate(lines[:-1], 1):
            try:
                try:
                    delta = json.loads(line, object_pairs_hook=_no_duplicates)
                except ValueError:
                    delta = _after_fragments(line)
                    if delta is None:
                        raise
                    self._log_torn = True       # the next edit writes the journal whole
                state = state.apply(_object(delta, "line"))
            except (ValueError, TypeError, RecursionError) as error:
                raise _refused(self.root, f"its {log} cannot be read: line {number}: "
                                          f"{error}") from None
        self._log_size = len(data) - len(lines[-1])
        return state

    def _remove_strays(self) -> None:
        """Remove our own files the journal does not name: superseded replacements, and
        what a daemon killed part-way left (a temporary file)."""
        named = {e.data for e in self.state.tensors.values() if e.data}
        for name in os.listdir(self._fd):
            if (_DATA_NAME.fullmatch(name) and name not in named) or _TEMP_NAME.fullmatch(name) \
                    or (_LOG_NAME.fullmatch(name) and name != self._log):
                try:
                    os.unlink(name, dir_fd=self._fd)
                except OSError:
                    pass

    # -- writing ---------------------------------------------------------------------------
    # Every write to ROOT is whole or not at all: a file is written under a temporary name,
    # fsynced and renamed into place (``_write``, ``PendingData.keep``), and a log line
    # appended is cut off again if any of it fails (``_append``).  A failed write (ENOSPC,
    # EDQUOT, EIO) leaves ROOT as it was, and is answered to the edit that made it; what was
    # answered before stays.
    def _write(self, dir_fd: int, name: str, data) -> None:
        """Replace ``name`` with ``data``, whole or not at all: a fresh temporary name,
        written, fsynced, renamed over; then the directory fsynced (runtime.write_file)."""
        write_file(dir_fd, name, data, durable=True)

    def put_data(self, data) -> str:
        """Keep a tensor's new bytes; the name of their file (for ``TensorEdit.data``)."""
        name = f"data-{os.urandom(16).hex()}.bin"
        self._write(self._fd, name, data)
        return name

    def drop_data(self, name: str) -> None:
        """Remove a file of new bytes that no state names (its edit was not kept)."""
        with self._lock:
            if any(e.data == name for e in self.state.tensors.values()):
                return
            self._data.pop(name, None)
            try:
                os.unlink(name, dir_fd=self._fd)
            except OSError:
                pass
            _fsync_dir(self._fd)

    def forget_data(self, name: str) -> None:
        """A file of new bytes opened for an edit that was then not kept: not held open."""
        with self._lock:
            if not any(e.data == name for e in self.state.tensors.values()):
                self._data.pop(name, None)

    def new_data(self) -> PendingData:
        """A replacement being written (a tensor's raw file open for writing): kept by
        ``PendingData.keep``, or dropped."""
        name = f"data-{os.urandom(16).hex()}.bin"
        tmp = f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=self._fd)
        return PendingData(self._fd, fd, tmp, name)

    def data(self, name: str, size: int | None = None) -> DataFile:
        """A replacement's bytes, open (kept open for the store's life): a regular file of
        the user's (of ``size`` bytes, where given), or ``EditsError`` saying what it is."""
        with self._lock:
            found = self._data.get(name)
            if found is None:
                try:
                    fd = open_own_file(self._fd, name, self._euid, size=size)
                except NotOwnFile as why:
                    raise _refused(self.root, f"its {why}") from None
                found = self._data[name] = DataFile(fd, os.fstat(fd).st_size, name)
            return found

    def commit(self, state: EditState) -> None:
        """Make ``state`` the edits, on disk first (the journal, atomically), then here; the
        replacements no longer named are removed.  An ``OSError`` (the disk full) leaves
        both as they were."""
        with self._lock:
            try:
                self._keep(state)
            except OSError as error:
                raise OSError(error.errno or errno.EIO,
                              f"{self.root}: the edit could not be kept: {error.strerror}") from None
            before = {e.data for e in self.state.tensors.values() if e.data}
            self.state = state
            after = {e.data for e in state.tensors.values() if e.data}
            for name in before - after:
                self._data.pop(name, None)          # open descriptors stay readable
                try:
                    os.unlink(name, dir_fd=self._fd)
                except OSError:
                    pass

    def _keep(self, state: EditState) -> None:
        """``state`` on disk: one line appended to the log, or the journal written whole
        (no journal yet, a log grown past it, a log whose end could not be cut back after
        a failed append, a change a line cannot say)."""
        log, delta = self._log, None
        if log is not None and self._log_size < max(LOG_FOLD, self._journal_size) \
                and not self._log_torn:
            delta = self.state.delta_to(state)
        if log is None or delta is None:
            self._fold(state)
            return
        line = json.dumps(delta, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"
        self._append(log, line)

    def _append(self, log: str, line: bytes) -> None:
        """``line`` at the end of the log, fsynced; if any of it fails, the log is cut back
        to its size before (a log it made is removed): a line is in the log whole, answered,
        or not at all.  Where even that fails, the next edit writes the journal whole."""
        created = False
        if self._log_fd is None:
            try:
                self._log_fd = open_own_file(self._fd, log, self._euid, os.O_WRONLY)
            except FileNotFoundError:
                self._log_fd = open_own_file(self._fd, log, self._euid,
                                             os.O_WRONLY | os.O_CREAT | os.O_EXCL)
                created = True
            except NotOwnFile as why:
                raise OSError(errno.EIO, f"its {why}") from None
            if created:
                _fsync_dir(self._fd)
        fd = self._log_fd
        view, at = memoryview(line), self._log_size
        try:
            while view:
                n = os.pwrite(fd, view, at)
                view, at = view[n:], at + n
            os.fsync(fd)
        except OSError:
            try:
                os.ftruncate(fd, self._log_size)
                os.fsync(fd)
            except OSError:
                self._log_torn = True       # the next edit folds: a new journal, a new log
            if created:
                self._forget_log(log, created)
            raise
        self._log_size += len(line)

    def _forget_log(self, log: str, created: bool) -> None:
        """A log this store just made, removed again (its first line failed)."""
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None
        if created:
            try:
                os.unlink(log, dir_fd=self._fd)
                os.fsync(self._fd)
            except OSError:
                pass

    def _fold(self, state: EditState) -> None:
        """The journal written whole, naming a new (empty) log; the old log removed."""
        old_log, old_fd = self._log, self._log_fd
        log = f"edits-{os.urandom(8).hex()}.log"
        doc = {"format": FORMAT, "source": self._identity, "log": log, **state.to_json()}
        text = json.dumps(doc, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"
        self._write(self._fd, JOURNAL, text)
        self._log, self._log_fd, self._log_size, self._journal_size = log, None, 0, len(text)
        self._log_torn = False
        if old_fd is not None:
            os.close(old_fd)
        if old_log is not None:
            try:
                os.unlink(old_log, dir_fd=self._fd)
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            self._data.clear()
            release(self._owner)
            if self._log_fd is not None:
                os.close(self._log_fd)
                self._log_fd = None
            try:
                os.close(self._fd)
            except OSError:
                pass
