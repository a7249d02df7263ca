"""The library API (docs/reference/api.md): a model's metadata, tensors, bytes and arrays, without FUSE.

::

    import tensorfs
    with tensorfs.open("model.gguf") as m:          # anything mount takes
        m.metadata["general.architecture"]          # the values metadata.json holds
        t = m.tensors["blk.0.attn_q.weight"]        # dtype, shape, offset, nbytes, file
        raw = m.read("blk.0.attn_q.weight")         # the stored bytes
        a = m.array("blk.0.attn_q.weight")          # the .npy view's values
        m.files["config.json"].size                 # what a mount's files/ holds (docs/internals/design.md)
        m.read_file("config.json")                  # ... and its bytes

It goes through the layers a mount uses — ``load_model`` (parsers, validation, shards),
one source per file, ``plan_view`` and the kernels of ``tensorfs.convert`` — and stops
below the tree: no path escaping, no cache, no FUSE.  So whatever a mount serves as
``weight.npy``, ``array`` returns with the same values, and whatever a mount refuses,
``open`` refuses with the same ``ModelError``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Iterator, NamedTuple

from tensorfs.convert.blocks import converted_array
from tensorfs.convert.plan import plan_view
from tensorfs.errors import ModelError
from tensorfs.loading.loader import load_model
from tensorfs.loading.wholefiles import whole_file_views
from tensorfs.model import Model, TensorInfo
from tensorfs.runtime.libraries import np
from tensorfs.sources.local import ModelSource, Source
from tensorfs.sources.urls import remote_settings

__all__ = ["open", "OpenModel", "ModelError", "TensorInfo", "WholeFile"]


class WholeFile(NamedTuple):
    """One file of ``files/``: its name there, size in bytes and mtime (ns)."""
    name: str
    size: int
    mtime_ns: int


class _Files(Mapping):
    """name -> ``WholeFile``, in a mount's ``files/`` order; a remote companion (a config
    file of a repository) is asked for its size only when its entry is looked at."""

    def __init__(self, views):
        self._views = views

    def __getitem__(self, name: str) -> WholeFile:
        view = self._views[name]
        mtime_ns = view.mtime_ns
        if mtime_ns is None:        # a remote file not opened yet: its listing gave no mtime
            mtime_ns = int(view.source.stat().st_mtime_ns)
        return WholeFile(name, view.size, mtime_ns)

    def __iter__(self) -> Iterator[str]:
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)

    def __repr__(self) -> str:
        return f"<files: {', '.join(self._views)}>"


class _Metadata(Mapping):
    """key -> value, each decoded when first asked for (a GGUF vocabulary is not turned into
    Python strings unless someone reads it)."""

    def __init__(self, metadata):
        self._raw = metadata
        self._decoded: dict = {}

    def __getitem__(self, key):
        try:
            return self._decoded[key]
        except KeyError:
            value = self._decoded[key] = self._raw[key].value()
            return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __repr__(self) -> str:
        return f"<metadata: {len(self)} keys>"


def open(model, *, storage_options: dict | None = None,
         timeout: float | None = None) -> "OpenModel":
    """Parse and validate ``model`` (a file, an index, a directory, a split GGUF's first
    shard, or a URL of any of those — what ``tensorfs mount`` takes); ``ModelError`` if it
    is refused.  Use it as a context manager, or call ``close()``.

    For a URL (docs/reference/remote.md, needs ``tensorfs-fuse[remote]``): ``storage_options`` are passed to
    fsspec (as ``--storage-option``), ``timeout`` bounds each read in seconds (``--timeout``);
    endpoints and credentials come from the environment as for a mount."""
    model = os.fspath(model)
    remote = remote_settings(model, storage_options=storage_options, timeout=timeout)
    if remote is None and (storage_options or timeout is not None):
        raise ValueError("storage_options and timeout apply to a URL only")
    return OpenModel(load_model(model, remote))


class OpenModel:
    """One parsed model with its files open.

    ``metadata``: key -> value, as ``metadata.json``'s ``"metadata"`` holds them.
    ``metadata_types``: key -> the format's type name (``"uint32"``, ``"array[string]"``).
    ``tensors``: name -> ``TensorInfo`` (``dtype`` as the format names it, ``shape`` in numpy
    order, ``offset`` absolute in ``file``, ``nbytes`` stored), in the model's order.
    ``model``: the underlying ``tensorfs.model.Model`` (format, version, shards ...).
    """

    def __init__(self, model: Model):
        self.model = model
        self.metadata: Mapping = _Metadata(model.metadata)
        self.metadata_types = {key: value.type_name for key, value in model.metadata.items()}
        self.tensors: Mapping[str, TensorInfo] = MappingProxyType({t.name: t for t in model.tensors})
        # The sources load_model parsed from (what was validated is what is read); a model
        # built by hand has none, and its files are opened here.
        self._sources: dict | None = dict(model.sources) or {
            f.path: ModelSource(f.path, f.file_size) for f in model.files}
        self._file_views = whole_file_views(model, self._sources)
        # ``files``: what a mount's files/ holds, name -> WholeFile (name, size, mtime_ns)
        self.files: Mapping[str, WholeFile] = _Files(self._file_views)

    # -- life ------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the model's files.  Arrays already returned stay valid (a memory map holds
        its own reference to the file)."""
        sources, self._sources = self._sources, None
        for source in (sources or {}).values():
            source.close()
        if sources is not None:
            for companion in self.model.companions:
                companion.close()

    def __enter__(self) -> "OpenModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._sources is None else f"{len(self.tensors)} tensors"
        return f"<tensorfs model {self.model.source!r}: {state}>"

    @property
    def format(self) -> str:
        return self.model.files[0].format

    # -- tensors ---------------------------------------------------------------------------
    def _tensor(self, name: str) -> tuple[TensorInfo, Source]:
        if self._sources is None:
            raise ValueError("the model is closed")
        try:
            tensor = self.tensors[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r}") from None
        return tensor, self._sources[tensor.file]

    def read(self, name: str, offset: int = 0, size: int | None = None) -> bytes:
        """The tensor's stored bytes, or ``size`` of them from ``offset`` (clipped to the
        tensor, as a file read is).  ``OSError`` (EIO) if the file changed since ``open``."""
        tensor, source = self._tensor(name)
        if offset < 0 or (size is not None and size < 0):
            raise ValueError("offset and size must not be negative")
        offset = min(offset, tensor.nbytes)
        end = tensor.nbytes if size is None else min(tensor.nbytes, offset + size)
        return source.read(tensor.offset + offset, end - offset)

    def read_file(self, name: str, offset: int = 0, size: int | None = None) -> bytes:
        """The bytes of the file ``files/NAME`` of a mount would hold (a model file, an
        index, a config or tokenizer file), or ``size`` of them from ``offset`` (clipped to
        the file).  ``KeyError`` for a name ``files`` lacks; ``OSError`` (EIO) if the file
        changed since ``open``."""
        if self._sources is None:
            raise ValueError("the model is closed")
        if offset < 0 or (size is not None and size < 0):
            raise ValueError("offset and size must not be negative")
        try:
            view = self._file_views[name]
        except KeyError:
            raise KeyError(f"no file named {name!r}") from None
        total = view.size
        offset = min(offset, total)
        end = total if size is None else min(total, offset + size)
        return view.read(offset, end - offset)

    def array(self, name: str) -> np.ndarray:
        """The values the tensor's ``.npy`` view holds, shaped in numpy order.

        A type numpy has (F32, F16, I8 ... and big-endian GGUF as ``>f4`` ...) is a read-only
        memory map of a local file, no copy; BF16, FP8 and GGML's quantized types are a new
        float32 array, converted by the kernels the mount uses.  A type without a view (F4
        ...) is a ``ModelError`` saying why, as ``metadata.json``'s ``raw_only`` does."""
        tensor, source = self._tensor(name)
        plan = plan_view(tensor)
        if plan.kind == "native":
            dtype = np.dtype(plan.npy_dtype)
            local = source.local_fd
            if local is not None and tensor.nbytes > 0:
                return _mapped(local, tensor, dtype)
            out = np.empty(tensor.shape, dtype)
            source.read_into(tensor.offset, _bytes_of(out))
            out.flags.writeable = False
            return out
        if plan.kind == "converted":
            return converted_array(source, tensor.offset, plan.conversion,
                                   tensor.n_elements).reshape(tensor.shape)
        raise ModelError("raw_only", f"tensor {name!r} has no array view: {plan.reason}",
                         name=name, file=tensor.file)

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


def _bytes_of(array: np.ndarray) -> memoryview:
    return memoryview(array.reshape(-1).view(np.uint8))  # type: ignore[arg-type, unused-ignore]


def _mapped(fd: int, tensor: TensorInfo, dtype: np.dtype) -> np.memmap:
    """A read-only ``numpy.memmap`` of the tensor's bytes, mapped from the descriptor the
    header was validated on (not the path again: it may name another file by now)."""
    with os.fdopen(os.dup(fd), "rb") as f:      # the map keeps a descriptor of its own
        return np.memmap(f, dtype, mode="r", offset=tensor.offset, shape=tensor.shape)
