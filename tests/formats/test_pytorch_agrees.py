"""tensorfs serves what ``torch.load(weights_only=True)`` gives, or refuses in one line
(issue 43): each file here is crafted to make a reader disagree with torch's -- its zip
container (read by miniz in torch), its tensors' rebuild arguments, its globals -- and is
loaded by torch itself in the test.  Where tensorfs serves the file, every tensor's values are
torch's; where it refuses, the refusal is one line naming what it met."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.support import run_tensorfs

torch = pytest.importorskip("torch")

import tensorfs  # noqa: E402
from tensorfs.errors import ModelError  # noqa: E402


def _saved(obj, path: Path | None = None) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    if path is not None:
        path.write_bytes(buf.getvalue())
    return buf.getvalue()


def _torch(path: Path):
    """torch's own reading of the file: its state dict, or None where torch refuses it."""
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, weights_only=True)
    except Exception:
        return None


def _flat(value, prefix=""):
    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _flat(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _flat(v, f"{prefix}.{i}" if prefix else str(i))


def _numpy(t):
    t = t.detach().resolve_conj().resolve_neg()
    if t.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        return t.float().numpy()
    return t.numpy()


def served_or_refused(path: Path) -> str | None:
    """None where tensorfs serves ``path`` with torch's values for every tensor (and torch
    loads it); else tensorfs's one-line refusal."""
    theirs = _torch(path)
    try:
        with tensorfs.open(path) as m:
            ours = {name: m.array(name) for name in m.tensors}
    except ModelError as error:
        text = str(error)
        assert "\n" not in text and text, text
        return text
    assert theirs is not None, f"tensorfs serves {path.name}, which torch refuses"
    expected = dict(_flat(theirs))
    assert set(ours) == set(expected)
    for name, t in expected.items():
        np.testing.assert_array_equal(ours[name], _numpy(t), err_msg=name)
        assert ours[name].shape == tuple(t.shape), name
    return None


def assert_refused(path: Path, *words: str) -> str:
    said = served_or_refused(path)
    assert said is not None, f"{path.name} is served"
    for word in words:
        assert word in said, said
    return said


# -- the zip container: the archive torch reads ----------------------------------------------

A = {"w": torch.arange(4.0)}
B = {"w": -torch.arange(4.0) - 10}


def _shifted(data: bytes, shift: int) -> bytes:
    """A torch.save archive with each of its absolute offsets moved by ``shift`` (to be
    placed ``shift`` bytes into another file)."""
    d = bytearray(data)
    e = d.rfind(b"PK\x05\x06")
    n, _, cd = struct.unpack_from("<HII", d, e + 10)
    struct.pack_into("<I", d, e + 16, cd + shift)
    if d[e - 20:e - 16] == b"PK\x06\x07":
        (rec,) = struct.unpack_from("<Q", d, e - 12)
        struct.pack_into("<Q", d, e - 12, rec + shift)
        (cd,) = struct.unpack_from("<Q", d, rec + 48)
        struct.pack_into("<Q", d, rec + 48, cd + shift)
    at = cd
    for _ in range(n):
        nlen, xlen, clen = struct.unpack_from("<HHH", d, at + 28)
        (local,) = struct.unpack_from("<I", d, at + 42)
        struct.pack_into("<I", d, at + 42, local + shift)
        at += 46 + nlen + xlen + clen
    return bytes(d)


def _end_record_in_comment(after: bytes = b"") -> bytes:
    """A's archive whose end-record comment holds B's whole archive (then ``after``): miniz
    takes the last end record, another reader the first."""
    a = _saved(A)
    e = a.rfind(b"PK\x05\x06")
    comment = _shifted(_saved(B), e + 22) + after
    out = bytearray(a[:e + 22])
    struct.pack_into("<H", out, e + 20, len(comment))
    return bytes(out) + comment


def _zip64_elsewhere() -> bytes:
    """A then B: the last end record's 32-bit fields name A's central directory, its zip64
    locator B's, which miniz follows."""
    a, b = _saved(A), _saved(B)
    out = bytearray(a + _shifted(b, len(a)))
    ea = a.rfind(b"PK\x05\x06")
    e = out.rfind(b"PK\x05\x06")
    out[e + 8:e + 20] = a[ea + 8:ea + 20]           # A's entry count, size and offset
    return bytes(out)


def _local_header_sizes_changed() -> bytes:
    data = bytearray(_saved(A))
    at = data.find(b"PK\x03\x04", data.find(b"data/0") - 40)
    struct.pack_into("<II", data, at + 18, 3, 5)    # the local sizes lie; miniz reads the central
    return bytes(data)


def _locator_to_nothing() -> bytes:
    """A zip64 locator pointing at no zip64 record: miniz ignores it, and so does tensorfs."""
    data = bytearray(_saved(A))
    e = data.rfind(b"PK\x05\x06")
    struct.pack_into("<Q", data, e - 12, 0)
    return bytes(data)


def _rewritten(change) -> bytes:
    src = io.BytesIO(_saved(A))
    out = io.BytesIO()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            for name, data in change(info.filename, zin.read(info.filename)):
                zout.writestr(zipfile.ZipInfo(name, info.date_time), data)
    return out.getvalue()


def _renamed(old: str, new: str):
    return lambda n, d: [(n.replace(old, new), d)]


def _version(text: bytes | None):
    def change(n, d):
        if n.endswith("/version"):
            return [] if text is None else [(n, text)]
        return [(n, d)]
    return change


ZIPS = {
    # (the file, None where it is served as torch reads it, else words of the refusal)
    "end record inside the comment, at the end": (lambda: _end_record_in_comment(),
                                                  ["two zip end records"]),
    "end record inside the comment, bytes after": (lambda: _end_record_in_comment(b"xyz"),
                                                   ["followed by", "not its 0-byte comment"]),
    "bytes after the archive": (lambda: _saved(A) + b"junk", ["followed by"]),
    "bytes before the archive": (lambda: b"junk" + _saved(A), ["first bytes"]),
    "zip64 record naming another directory": (_zip64_elsewhere, ["different archives"]),
    "zip64 locator to nothing": (_locator_to_nothing, None),
    "local header sizes differ": (_local_header_sizes_changed, None),
    "two entries of one name": (lambda: _rewritten(lambda n, d: [(n, d), (n, d)]
                                                   if n.endswith("data/0") else [(n, d)]),
                                ["two entries named"]),
    "names differing in case": (lambda: _rewritten(lambda n, d: [(n, d), (n.upper(), d)]
                                                   if n.endswith("data/0") else [(n, d)]),
                                ["differ only in case"]),
    "no version record": (lambda: _rewritten(_version(None)), ["no version record"]),
    "version too new": (lambda: _rewritten(_version(b"11\n")), ["archive version"]),
    "version unreadable": (lambda: _rewritten(_version(b"three")), ["archive version"]),
    "version as stoll reads it": (lambda: _rewritten(_version(b" 3 trailing")), None),
    "storage alignment unreadable": (
        lambda: _rewritten(lambda n, d: [(n, b"x" if n.endswith(".storage_alignment") else d)]),
        ["storage alignment"]),
    "another top folder name": (lambda: _rewritten(_renamed("archive/", "weights/")), None),
    "two top folders": (lambda: _rewritten(lambda n, d: [(n.replace("archive/", "other/"), d)]
                                           if n.endswith("data/0") else [(n, d)]),
                        ["one folder"]),
}


@pytest.mark.parametrize("case", list(ZIPS))
def test_zip_is_read_as_torch_reads_it(tmp_path, case):
    make, refused = ZIPS[case]
    path = tmp_path / "crafted.pt"
    path.write_bytes(make())
    if refused is None:
        assert served_or_refused(path) is None
    else:
        assert_refused(path, *refused)


def test_end_record_in_comment_is_refused_by_the_command_in_one_line(tmp_path):
    path = tmp_path / "two-ends.pt"
    path.write_bytes(_end_record_in_comment(b"xyz"))
    # torch takes the archive in the comment, B; a reader of the first end record, A
    assert torch.equal(_torch(path)["w"], B["w"])
    result = run_tensorfs("inspect", path)
    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "zip end record" in result.stderr
