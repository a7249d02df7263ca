"""The one description of a model that every parser produces and everything else consumes.

Parsers (``tensorfs.formats``) know bytes; everything downstream (views, namespace, FUSE)
knows only these frozen records.  Metadata values are decoded lazily: a parser records where
a value lies and what it is, and ``MetadataValue.value()`` turns it into Python only when
asked, so a 150k-entry vocabulary costs nothing at mount time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple


class TensorInfo(NamedTuple):
    """One tensor as stored in one file.

    A named tuple rather than a frozen dataclass (like gguf-py's ``ReaderTensor``): just as
    immutable, and 5x cheaper to build, which is most of a 100k-tensor header's parse.

    ``dtype`` is the format's own type name (safetensors: "F32", "BF16", "F8_E4M3" ...;
    GGUF: ggml's names, "F32", "Q4_K", "IQ2_XS" ...).  ``shape`` is in numpy (row-major)
    order.  ``offset`` is absolute in ``file``; ``nbytes`` is the exact stored size.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    file: str
    byte_order: str = "<"           # "<" or ">": byte order of the element / scale lanes
    ggml_type: int | None = None    # the GGUF type id; None for safetensors
    # a PyTorch tensor that is not contiguous in its storage: its strides (elements), with
    # ``offset`` the byte of element 0 and ``nbytes`` its elements' bytes, gathered by who
    # serves it (tensorfs.loading.checkpoints); None: the bytes are [offset, offset + nbytes)
    strides: tuple[int, ...] | None = None

    @property
    def n_elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass(frozen=True)
class MetadataValue:
    """A metadata value, decoded on demand.

    ``type_name`` is the format's name for it: GGUF "uint32", "string", "array[string]",
    "array[array[int32]]" ...; safetensors "string".  ``count`` is the element count of an
    array (None for a scalar).  ``value()`` returns the full JSON-ready value: ints exact,
    floats as the shortest decimal that round-trips in their stored width, non-finite floats
    as the strings "nan", "inf", "-inf", arrays as lists.
    """

    type_name: str
    decode: Callable[[], object] = field(repr=False, compare=False)
    count: int | None = None

    def value(self) -> object:
        return self.decode()

    @staticmethod
    def of(type_name: str, value: object) -> "MetadataValue":
        """A value that is already decoded (safetensors strings, small scalars)."""
        return MetadataValue(type_name, lambda: value, None)


@dataclass(frozen=True)
class ModelFile:
    """One parsed and validated model file.

    ``header_size`` is the length of everything before the tensor data: for safetensors the
    8-byte length plus the JSON (padding included), for GGUF the header, KV pairs, tensor
    infos and alignment padding.  ``tensors`` are in the order the file lists them.
    """

    format: str                     # "gguf" | "safetensors" | "pytorch"
    version: int | None             # GGUF version; None for safetensors
    path: str
    file_size: int
    endianness: str                 # "little" | "big"
    alignment: int | None           # GGUF data alignment; None for safetensors
    header_size: int                # == data_offset
    metadata: Mapping[str, MetadataValue]
    tensors: tuple[TensorInfo, ...]
    mtime: float = 0.0

    @property
    def data_offset(self) -> int:
        return self.header_size


@dataclass(frozen=True)
class Model:
    """What one mount serves: one file, or the shards of one model (``files`` in order)."""

    files: tuple[ModelFile, ...]
    tensors: tuple[TensorInfo, ...]
    metadata: Mapping[str, MetadataValue]
    source: str                     # what the user named: a file, an index, a directory, a URL
    # each file's source (tensorfs.sources.local), by ModelFile.path: the very ones the files were
    # parsed from, so that a mount serves what it parsed.  Empty for a model built by hand.
    sources: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    url: str | None = None          # the URL the user named (without credentials), if remote
    # the other files served whole in files/ (docs/internals/design.md): an index, a directory's config and
    # tokenizer files (tensorfs.loading.wholefiles.Companion)
    companions: tuple = field(default=(), compare=False, repr=False)

    def close(self) -> None:
        for source in self.sources.values():
            source.close()
        for companion in self.companions:
            companion.close()

    @property
    def sharded(self) -> bool:
        return len(self.files) > 1 or self.source != self.files[0].path

    @staticmethod
    def single(model_file: ModelFile) -> "Model":
        return Model((model_file,), model_file.tensors, model_file.metadata, model_file.path)
