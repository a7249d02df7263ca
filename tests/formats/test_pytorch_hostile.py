"""Hostile and damaged PyTorch checkpoints (issue 38): each payload is shown live by
``torch.load(weights_only=False)`` in the test itself (it writes a marker file), then
tensorfs refuses the file in one line -- ``mount``, ``inspect`` and ``tensorfs.open``
alike -- and the marker is never written again.  Damaged containers are refused in one
line, never a traceback or wrong bytes."""

from __future__ import annotations

import pickle
import re
import struct
import zipfile
from pathlib import Path

import pytest

from tests.support import mount_expecting_refusal, run_tensorfs
from tests.support.pytorch_models import rewrite_entries

torch = pytest.importorskip("torch")

import tensorfs  # noqa: E402
from tensorfs.errors import ModelError  # noqa: E402


def _valid(tmp_path: Path) -> Path:
    path = tmp_path / "valid.pt"
    torch.manual_seed(0)
    torch.save({"w": torch.randn(4, 4), "b": torch.arange(3)}, path)
    return path


def _with_pickle(tmp_path: Path, data: bytes, name: str = "hostile.pt") -> Path:
    return rewrite_entries(_valid(tmp_path), tmp_path / name,
                           lambda n, d: (n, data if n.endswith("/data.pkl") else d,
                                         zipfile.ZIP_STORED))


def _unicode(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


class _Reduce:
    def __init__(self, func, args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _payloads(marker: Path) -> dict[str, tuple[bytes | None, str]]:
    """name -> (data.pkl, the global the refusal names); None: written by torch.save."""
    import os
    import subprocess

    touch = f"touch {marker}"
    write = f"open({str(marker)!r}, 'w').write('ran')"
    return {
        "os.system": (b"\x80\x02cos\nsystem\n" + _unicode(touch) + b"\x85R.", "os.system"),
        "builtins.exec": (b"\x80\x02cbuiltins\nexec\n" + _unicode(write) + b"\x85R.",
                          "builtins.exec"),
        "builtins.eval": (b"\x80\x02cbuiltins\neval\n" + _unicode(write) + b"\x85R.",
                          "builtins.eval"),
        # protocol 3: protocol 2 writes Python 2's name of the module ("commands")
        "subprocess": (pickle.dumps(_Reduce(subprocess.call, (["touch", str(marker)],)),
                                    protocol=3), "subprocess.call"),
        "protocol 0 text": (f"cos\nsystem\n(S'{touch}'\ntR.".encode(), "os.system"),
        # torch's weights-only reader takes no STACK_GLOBAL (nor protocol 4's FRAME): the
        # refusal names the opcode, before any global is read
        "STACK_GLOBAL": (pickle.dumps(_Reduce(os.system, (touch,)), protocol=4),
                         "opcode FRAME (pickle protocol 4)"),
        "STACK_GLOBAL unframed": (b"\x80\x02" + _unicode(os.system.__module__) +
                                  _unicode("system") + b"\x93" + _unicode(touch) + b"\x85R.",
                                  "opcode STACK_GLOBAL (pickle protocol 4)"),
        # a name that looks like torch's and resolves (protocol 4 dotted names) to os.system
        "look-alike": (b"\x80\x04ctorch.serialization\nos.system\n" + _unicode(touch) +
                       b"\x85R.", "torch.serialization.os.system"),
        "look-alike module": (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2.__globals__\n"
                              b"q\x00.", "torch._utils._rebuild_tensor_v2.__globals__"),
        "nested in a state dict": (None, f"{os.system.__module__}.system"),
    }


PAYLOADS = list(_payloads(Path("/m")))


@pytest.mark.parametrize("which", PAYLOADS)
def test_hostile_pickle_is_refused_and_never_runs(tmp_path, which):
    marker = tmp_path / "marker"
    data, named = _payloads(marker)[which]
    if data is None:
        import os

        path = tmp_path / "hostile.pt"
        torch.save({"w": torch.ones(2), "layer": {"x": _Reduce(os.system, (f"touch {marker}",))}},
                   path)
    else:
        path = _with_pickle(tmp_path, data)
    # the payload is live: torch's unsafe load runs it
    try:
        torch.load(path, weights_only=False)
    except Exception:
        pass
    if which != "look-alike module":          # that one only reaches a function's globals
        assert marker.exists(), f"the {which} payload did not run under torch.load"
        marker.unlink()
    # torch's safe reader refuses it too
    with pytest.raises(Exception):
        torch.load(path, weights_only=True)

    result = run_tensorfs("inspect", path)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    said = named if named.startswith("opcode ") else f"forbidden global {named}"
    assert said in lines[0] and " at byte " in lines[0], lines[0]

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    refused, mounted = mount_expecting_refusal(path, mnt)
    assert refused.returncode != 0 and not mounted
    assert len(refused.stderr.splitlines()) == 1 and said in refused.stderr

    with pytest.raises(ModelError, match=re.escape(said)):
        tensorfs.open(path)
    assert not marker.exists()


def _refused_in_one_line(path: Path, *words: str) -> str:
    result = run_tensorfs("inspect", path)
    assert result.returncode == 1, result.stdout
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr, \
        result.stderr
    said = result.stderr.split(f"{path}: ", 1)[-1]        # the words, not the test's path
    for word in words:
        assert word in said, result.stderr
    with pytest.raises(ModelError):
        tensorfs.open(path)
    return result.stderr


def test_truncated_checkpoint(tmp_path):
    valid = _valid(tmp_path).read_bytes()
    for cut in (len(valid) - 1, len(valid) // 2, 100, 3):
        path = tmp_path / f"cut{cut}.pt"
        path.write_bytes(valid[:cut])
        _refused_in_one_line(path, "truncated" if cut > 3 else "not")


def test_storage_shorter_than_its_tensors(tmp_path):
    path = rewrite_entries(_valid(tmp_path), tmp_path / "short.pt",
                           lambda n, d: (n, d[:-4] if n.endswith("/data/0") else d,
                                         zipfile.ZIP_STORED))
    _refused_in_one_line(path, "shorter than")


def test_traversal_in_entry_names(tmp_path):
    for bad in ("../../etc/passwd", "/abs", "a\\b"):
        path = rewrite_entries(_valid(tmp_path), tmp_path / "trav.pt",
                               lambda n, d: (n.replace("data/1", bad), d, zipfile.ZIP_STORED))
        _refused_in_one_line(path, "unsafe entry name")


def test_compressed_entries(tmp_path):
    for which in ("/data/0", "/data.pkl"):
        path = rewrite_entries(_valid(tmp_path), tmp_path / "deflated.pt",
                               lambda n, d: (n, d, zipfile.ZIP_DEFLATED if n.endswith(which)
                                             else zipfile.ZIP_STORED))
        _refused_in_one_line(path, "compressed")


def test_legacy_format(tmp_path):
    path = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False)
    _refused_in_one_line(path, "legacy format")


def test_big_endian_byteorder(tmp_path):
    path = rewrite_entries(_valid(tmp_path), tmp_path / "big.pt",
                           lambda n, d: (n, b"big" if n.endswith("/byteorder") else d,
                                         zipfile.ZIP_STORED))
    _refused_in_one_line(path, "byteorder", "little-endian")


def test_a_storage_missing_and_a_tensor_past_its_storage(tmp_path):
    path = rewrite_entries(_valid(tmp_path), tmp_path / "gone.pt",
                           lambda n, d: (n.replace("/data/1", "/data/9"), d, zipfile.ZIP_STORED))
    _refused_in_one_line(path, "storage", "no entry")
    # a tensor view claiming more elements than its storage holds
    import collections

    state = collections.OrderedDict(w=torch.ones(4))
    path = tmp_path / "past.pt"
    torch.save(state, path)
    with zipfile.ZipFile(path) as z:
        pkl = z.read("past/data.pkl")
    grown = pkl.replace(b"K\x04\x85", b"K\x05\x85", 1)     # the size (4,) -> (5,)
    assert grown != pkl
    path = rewrite_entries(path, tmp_path / "past2.pt",
                           lambda n, d: (n, grown if n.endswith("/data.pkl") else d,
                                         zipfile.ZIP_STORED))
    _refused_in_one_line(path, "runs past its storage")


@pytest.mark.parametrize("state, words", [
    ({"__metadata__": "tensor"}, ["'__metadata__'", "safetensors header"]),
    ({"a\udc80b": "tensor"}, ["not valid UTF-8"]),
    ({"w": "tensor", "note": "x\ud800"}, ["not valid UTF-8"]),
])
def test_names_no_safetensors_header_can_hold(tmp_path, state, words):
    """A key or value the composed header (or metadata.json) could not write is refused in
    one line by the reader, not met later by the safetensors parser."""
    path = tmp_path / "odd.pt"
    torch.save({k: torch.ones(2) if v == "tensor" else v for k, v in state.items()}, path)
    _refused_in_one_line(path, *words)


# -- parsing costs what the file is worth (issue 43) -------------------------------------------

def _crafted(tmp_path: Path, pkl: bytes, name: str = "crafted.pt") -> Path:
    """A checkpoint of ``pkl`` with one float storage "0" of 4 elements."""
    import io

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", b"little")
        z.writestr("archive/data/0", bytes(16))
        z.writestr("archive/version", b"3\n")
    path = tmp_path / name
    path.write_bytes(out.getvalue())
    return path


TENSOR = (b"ctorch._utils\n_rebuild_tensor_v2\n((" + _unicode("storage") +
          b"ctorch\nFloatStorage\n" + _unicode("0") + _unicode("cpu") + b"K\x04tQK\x00K\x04"
          b"\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtR")


def test_a_long_key_reused_at_every_level_is_refused_in_one_line(tmp_path):
    """A 256 KiB key, memoized once, names a dict at each of 62 levels: the names it makes
    would take gigabytes (its 257 KB file is refused, in one line, in little time)."""
    body = TENSOR
    for _ in range(61):
        body = b"}(h\x00" + body + _unicode("v") + b"K\x01u"
    pkl = b"\x80\x02}(" + _unicode("k" * (256 << 10)) + b"q\x00" + body + b"u."
    path = _crafted(tmp_path, pkl)
    assert path.stat().st_size < 270_000
    said = _refused_in_one_line(path, "names", "longer than the pickle is worth")
    assert "MemoryError" not in said


def test_a_large_value_passed_to_many_calls_is_refused_in_one_line(tmp_path):
    """A 100,000-integer list, memoized, is given to torch.Size 100,000 times: each call
    copies it, 10^10 items in all from a 1 MB file."""
    n = 100_000
    ints = b"](" + b"K\x01" * n + b"eq\x01"
    calls = b"ctorch\nSize\nq\x02" + b"](" + b"h\x02h\x01\x85R" * n + b"e"
    pkl = b"\x80\x02}(" + _unicode("w") + TENSOR + _unicode("a") + ints + _unicode("b") + \
        calls + b"u."
    _refused_in_one_line(_crafted(tmp_path, pkl), "cost more than it is worth")


def test_a_huge_bytearray_is_refused_in_one_line(tmp_path):
    pkl = (b"\x80\x02}(" + _unicode("w") + TENSOR + _unicode("b") +
           b"cbuiltins\nbytearray\nJ\xff\xff\xff\x7f\x85Ru.")
    _refused_in_one_line(_crafted(tmp_path, pkl), "cost more than it is worth")


# -- odd values are one line (issue 43) --------------------------------------------------------

@pytest.mark.parametrize("value, words", [
    # a 4,400-digit integer: torch's reader takes no INT/LONG text opcode; LONG1 holds 255 bytes
    (b"I" + b"9" * 4400 + b"\n", ["opcode INT"]),
    (b"\x8b\x00\x10\x00\x00" + b"\xff" * 4096, ["opcode LONG4"]),
    (b"\x8a\xff" + b"\x7f" * 255, None),                  # the largest int torch reads: served
])
def test_huge_integers_are_one_line(tmp_path, value, words):
    pkl = b"\x80\x02}(" + _unicode("w") + TENSOR + _unicode("n") + value + b"u."
    path = _crafted(tmp_path, pkl)
    if words is None:
        result = run_tensorfs("inspect", path)
        assert result.returncode == 0, result.stderr
        with tensorfs.open(path) as m:
            assert m.metadata["n"] == int.from_bytes(b"\x7f" * 255, "little")
    else:
        _refused_in_one_line(path, *words)


@pytest.mark.parametrize("where", ["offset", "size", "stride", "numel"])
def test_a_huge_integer_as_a_tensors_geometry_is_one_line(tmp_path, where):
    big = b"\x8a\xff" + b"\x7f" * 255
    tensor = {
        "offset": TENSOR.replace(b"QK\x00K\x04", b"Q" + big + b"K\x04"),
        "size": TENSOR.replace(b"K\x04\x85K\x01", big + b"\x85K\x01"),
        "stride": TENSOR.replace(b"\x85K\x01\x85", b"\x85" + big + b"\x85"),
        "numel": TENSOR.replace(b"K\x04tQ", big + b"tQ"),
    }[where]
    assert tensor != TENSOR
    pkl = b"\x80\x02}(" + _unicode("w") + tensor + b"u."
    _refused_in_one_line(_crafted(tmp_path, pkl))
