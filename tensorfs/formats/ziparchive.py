"""The zip container of a ``torch.save`` checkpoint, read as torch reads it.

``torch.load`` opens the archive with caffe2's ``PyTorchStreamReader`` (miniz underneath),
and whatever miniz takes is what torch serves: this module is the one place where the rules
that keep tensorfs reading that same archive live.  The end records and the central
directory are read and checked here, and each needed entry's local header too (``zipfile``
is not used: it trusts what it reads).  Every refusal is a ``PytorchError`` of kind ``zip``,
in one line.
"""

from __future__ import annotations

import re
import struct
from typing import Callable, NamedTuple

from tensorfs.errors import PytorchError

ZIP_MAGIC = b"PK\x03\x04"
_EOCD = b"PK\x05\x06"
_EOCD64 = b"PK\x06\x06"
_LOCATOR64 = b"PK\x06\x07"
_CENTRAL = b"PK\x01\x02"
MAX_CENTRAL_DIRECTORY = 64 << 20    # bytes read as the list of entries, at most
MAX_ENTRIES = 1 << 20
NEARBY = 256 << 10                  # local headers this close are read in one stretch
# The archive versions torch's reader takes (PyTorchStreamReader: kMin/kMaxSupportedFileFormatVersion)
MIN_VERSION, MAX_VERSION = 1, 10
_STOLL = re.compile(rb"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def _error(kind: str, message: str, offset: int | None = None) -> PytorchError:
    return PytorchError(kind, message, offset=offset)


class Entry(NamedTuple):
    name: str
    offset: int          # of its data, in the file
    size: int


def _u(data: bytes, at: int, fmt: str):
    return struct.unpack_from("<" + fmt, data, at)


def read_exact(read: Callable, file_size: int, offset: int, size: int, what: str) -> bytes:
    if offset < 0 or size < 0 or offset + size > file_size:
        raise _error("zip", f"{what} runs past the end of the file "
                     f"({offset + size} > {file_size} bytes): truncated?", offset=offset)
    data = read(offset, size)
    if len(data) != size:
        raise _error("zip", f"{what}: short read", offset=offset)
    return data


def _central_directory(read, file_size: int) -> tuple[int, int, int]:
    """(offset, size, entries) of the central directory, from the end records, found as
    miniz (torch's zip reader) finds them: the end record is the last ``PK\\5\\6`` with 22
    bytes after it, and a zip64 locator just before it is followed whenever it points at a
    zip64 end record, whatever the 32-bit fields say.  What miniz would take and another
    reader would not is refused: an end record not followed by exactly its comment (a second
    one inside the comment, bytes after the archive), two end records that each end the
    file, 32-bit fields that disagree with the zip64 record."""
    tail_size = min(file_size, 22 + 0xFFFF)
    tail_at = file_size - tail_size
    tail = read_exact(read, file_size, tail_at, tail_size, "the end of the zip")
    at = tail.rfind(_EOCD, 0, max(0, len(tail) - 18))
    if at < 0:
        raise _error("zip", "no zip end record: the file is truncated, or not a zip "
                     "written by torch.save", offset=file_size)
    eocd = tail_at + at
    (comment,) = _u(tail, at + 20, "H")
    if at + 22 + comment != len(tail):
        raise _error("zip", f"the zip end record at byte {eocd} is followed by "
                     f"{len(tail) - at - 22} bytes, not its {comment}-byte comment (an end "
                     "record inside another's comment, or bytes after the archive)", offset=eocd)
    other = tail.rfind(_EOCD, 0, at)
    while other >= 0:
        if other + 22 <= len(tail) and other + 22 + _u(tail, other + 20, "H")[0] == len(tail):
            raise _error("zip", f"two zip end records (at bytes {tail_at + other} and {eocd}), "
                         "one inside the other's comment: zip readers differ on which to take",
                         offset=tail_at + other)
        other = tail.rfind(_EOCD, 0, other)
    disk, cd_disk, n_disk, n, cd_size, cd_offset = _u(tail, at + 4, "HHHHII")
    end = eocd
    zip64 = None
    if eocd >= 20 + 56:
        locator = read_exact(read, file_size, eocd - 20, 20, "the zip64 end record locator")
        if locator[:4] == _LOCATOR64:
            _, rec, disks = _u(locator, 4, "IQI")
            if rec > file_size - 56:
                raise _error("zip", "the zip64 end record locator points past the end of the "
                             "file", offset=eocd - 20)
            head = read_exact(read, file_size, rec, 56, "the zip64 end record")
            if head[:4] == _EOCD64:            # else miniz ignores the locator: so does this
                (size,) = _u(head, 4, "Q")
                if size < 44 or disks != 1:
                    raise _error("zip", "a damaged or multi-disk zip64 end record", offset=rec)
                zip64 = _u(head, 16, "IIQQQQ")
                end = rec
    if zip64 is not None:
        for short, long, marker in zip((disk, cd_disk, n_disk, n, cd_size, cd_offset), zip64,
                                       (0xFFFF, 0xFFFF, 0xFFFF, 0xFFFF, 0xFFFFFFFF,
                                        0xFFFFFFFF)):
            if short != long and short != marker:
                raise _error("zip", "the zip end record and its zip64 end record describe "
                             "different archives", offset=eocd)
        disk, cd_disk, n_disk, n, cd_size, cd_offset = zip64
    elif 0xFFFF in (n,) or 0xFFFFFFFF in (cd_size, cd_offset):
        raise _error("zip", "zip64 end record locator missing", offset=eocd)
    if disk != 0 or cd_disk != 0 or n_disk != n:
        raise _error("zip", "a multi-disk zip archive", offset=eocd)
    if cd_offset + cd_size > end:
        raise _error("zip", "the central directory runs past the end records: the file "
                     "is truncated", offset=cd_offset)
    if cd_size > MAX_CENTRAL_DIRECTORY or n > MAX_ENTRIES:
        raise _error("zip", f"{n} entries in {cd_size} bytes: more than tensorfs reads "
                     f"({MAX_ENTRIES} entries, {MAX_CENTRAL_DIRECTORY} bytes)", offset=cd_offset)
    if cd_size < 46 * n:
        raise _error("zip", f"{n} entries in a central directory of {cd_size} bytes",
                     offset=cd_offset)
    return cd_offset, cd_size, n


def _name_problem(name: str) -> str | None:
    if not name or name.startswith("/") or "\\" in name or "\0" in name:
        return "not a relative path"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "an empty, . or .. component"
    return None


def read_entries(read, file_size: int) -> dict[str, Entry]:
    """Every entry of the archive by name, each checked: stored, unencrypted, a safe name,
    inside the file, its local header agreeing with the central directory."""
    cd_offset, cd_size, n = _central_directory(read, file_size)
    cd = read_exact(read, file_size, cd_offset, cd_size, "the central directory")
    entries: dict[str, Entry] = {}
    names_folded: dict[bytes, str] = {}
    headers: list[tuple[str, int, int, int]] = []
    at = 0
    for _ in range(n):
        if cd[at:at + 4] != _CENTRAL or at + 46 > len(cd):
            raise _error("zip", "a damaged central directory entry", offset=cd_offset + at)
        flags, method = _u(cd, at + 8, "HH")
        csize, usize, nlen, xlen, clen = _u(cd, at + 20, "IIHHH")
        (local,) = _u(cd, at + 42, "I")
        end = at + 46 + nlen + xlen + clen
        if end > len(cd):
            raise _error("zip", "a damaged central directory entry", offset=cd_offset + at)
        raw = cd[at + 46:at + 46 + nlen]
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _error("zip", f"entry name {raw!r} is not UTF-8", offset=cd_offset + at) from None
        csize, usize, local = _zip64(cd[at + 46 + nlen:at + 46 + nlen + xlen],
                                     csize, usize, local, cd_offset + at)
        problem = _name_problem(name)
        if problem is not None:
            raise _error("zip", f"unsafe entry name {name!r} ({problem})", offset=cd_offset + at)
        if name in entries:
            raise _error("zip", f"two entries named {name!r}", offset=cd_offset + at)
        folded = raw.lower()            # miniz finds a name whatever its ASCII case
        if folded in names_folded:
            raise _error("zip", f"entries {names_folded[folded]!r} and {name!r} differ only "
                         "in case, which torch's zip reader does not tell apart",
                         offset=cd_offset + at)
        names_folded[folded] = name
        if flags & 1:
            raise _error("zip", f"entry {name!r} is encrypted", offset=cd_offset + at)
        entries[name] = Entry(name, -1, usize)
        headers.append((name, local, csize, method))
        at = end
    prefixes = {name.split("/", 1)[0] for name in entries if "/" in name}
    if len(prefixes) > 1 or any("/" not in name for name in entries):
        raise _error("zip", "entries not all under one folder: not written by torch.save")
    out = {}
    near = _Nearby(read, file_size, sorted((local, len(name.encode("utf-8")))
                                           for name, local, _, _ in headers))
    for name, local, csize, method in headers:
        if method != 0 or csize != entries[name].size:
            out[name] = Entry(name, -method - 1 if method else -1, entries[name].size)
            continue
        head = near.read(local, 30, f"the local header of {name!r}")
        if head[:4] != ZIP_MAGIC:
            raise _error("zip", f"entry {name!r}: no local header where the central "
                         "directory says", offset=local)
        (lmethod,) = _u(head, 8, "H")
        lnlen, lxlen = _u(head, 26, "HH")
        lname = near.read(local + 30, lnlen, f"the local header of {name!r}")
        if lname != name.encode("utf-8") or lmethod != method:
            raise _error("zip", f"entry {name!r}: its local header differs from the central "
                         "directory", offset=local)
        data = local + 30 + lnlen + lxlen
        if data + csize > cd_offset:
            raise _error("zip", f"entry {name!r} runs past the start of the central "
                         f"directory: the file is truncated or damaged", offset=data)
        out[name] = Entry(name, data, csize)
    spans = sorted((e.offset, e.offset + e.size, e.name) for e in out.values()
                   if e.offset >= 0 and e.size)
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise _error("zip", f"entries {a!r} and {b!r} overlap", offset=start)
    return out


class _Nearby:
    """The local headers read a stretch at a time: headers less than ``NEARBY`` apart (the
    small storages between them) in one read, a remote file's one request, instead of two
    reads each."""

    def __init__(self, read, file_size: int, headers: list[tuple[int, int]]):
        self._read, self._size = read, file_size
        self.stretches: list[tuple[int, bytes]] = []
        i = 0
        while i < len(headers):
            start = headers[i][0]
            j = i
            while j + 1 < len(headers) and headers[j + 1][0] - start <= NEARBY:
                j += 1
            end = min(file_size, headers[j][0] + 30 + headers[j][1] + 64)
            if j > i and 0 <= start < end:
                self.stretches.append((start, read_exact(read, file_size, start, end - start,
                                                    "the local headers")))
            i = j + 1

    def read(self, offset: int, size: int, what: str) -> bytes:
        for start, data in self.stretches:
            if start <= offset and offset + size <= start + len(data):
                return data[offset - start:offset - start + size]
        return read_exact(self._read, self._size, offset, size, what)


def _zip64(extra: bytes, csize: int, usize: int, local: int, where: int):
    at = 0
    while at + 4 <= len(extra):
        tag, size = _u(extra, at, "HH")
        if tag == 1:
            body = extra[at + 4:at + 4 + size]
            values = [usize, csize, local]
            i = 0
            for k, v in enumerate(values):
                if v == 0xFFFFFFFF:
                    if i + 8 > len(body):
                        raise _error("zip", "a damaged zip64 extra field", offset=where)
                    values[k] = _u(body, i, "Q")[0]
                    i += 8
            usize, csize, local = values
            return csize, usize, local
        at += 4 + size
    if 0xFFFFFFFF in (csize, usize, local):
        raise _error("zip", "zip64 sizes without their extra field", offset=where)
    return csize, usize, local


def archive_prefix(entries: dict[str, Entry]) -> str:
    """The folder torch reads every record from: that of the central directory's first
    entry (``read_entries`` has checked that every entry is under it)."""
    return next(iter(entries)).split("/", 1)[0] if entries else ""


def record(read, file_size: int, entries: dict[str, Entry], name: str,
           limit: int) -> bytes | None:
    """A small record's bytes (``None``: absent); refused when compressed or over
    ``limit`` bytes."""
    entry = entries.get(name)
    if entry is None:
        return None
    if entry.offset < 0:
        raise _error("zip", f"entry {name!r} is compressed (method {-entry.offset - 1}): "
                     "torch.save stores every entry")
    if entry.size > limit:
        raise _error("zip", f"entry {name!r} is {entry.size} bytes, more than the {limit} "
                     "such a record has", offset=entry.offset)
    return read_exact(read, file_size, entry.offset, entry.size, name)


def check_records(read, file_size: int, entries: dict[str, Entry], prefix: str) -> None:
    """The records torch's reader checks before it reads anything else: a version
    (``.data/version``, else ``version``: an integer as ``std::stoll`` reads it, from
    ``MIN_VERSION`` to ``MAX_VERSION``) and, where there are, a ``.data/serialization_id`` of
    UTF-8 and a ``.storage_alignment`` that Python's ``int`` reads."""
    version = record(read, file_size, entries, f"{prefix}/.data/version", 64)
    if version is None:
        version = record(read, file_size, entries, f"{prefix}/version", 64)
    if version is None:
        raise _error("zip", "no version record: not an archive written by torch.save")
    match = _STOLL.match(version)
    if match is None or not MIN_VERSION <= int(match[1]) <= MAX_VERSION:
        raise _error("zip", f"archive version {version[:20]!r}: torch reads versions "
                     f"{MIN_VERSION} to {MAX_VERSION}")
    ident = record(read, file_size, entries, f"{prefix}/.data/serialization_id", 4096)
    if ident is not None:
        try:                # torch.load hands it to Python as a str
            ident.decode("utf-8")
        except UnicodeDecodeError:
            raise _error("zip", f"serialization id {ident[:20]!r} is not UTF-8") from None
    alignment = record(read, file_size, entries, f"{prefix}/.storage_alignment", 64)
    if alignment is not None:
        try:
            int(alignment)
        except ValueError:
            raise _error("zip", f"storage alignment {alignment[:20]!r} is not a number") \
                from None
