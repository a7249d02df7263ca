"""GGUF writing: metadata values and tensor infos as bytes, beside the parser
(tensorfs.formats.gguf), as gguf-py keeps its writer beside its reader.

``ValueWriter`` encodes what ``MetadataValue.value()`` gives back (the JSON-ready form:
``"nan"``, ``"inf"`` and ``"-inf"`` for such floats) in one byte order and GGUF version, and
refuses -- ``ValueError``, one line -- what the format cannot hold or a reader would not read
back as written: a value outside its type's range, a value of another kind than its type
(a string for a uint32, a bool for an int), an unknown type.  ``check_alignment`` and
``check_tensor_name`` say what llama.cpp refuses to load.
"""

from __future__ import annotations

import struct

from tensorfs.dtypes import GGUF_ARRAY, GGUF_VALUE_TYPES
from tensorfs.formats.gguf import DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH

__all__ = ["DEFAULT_ALIGNMENT", "INT_RANGES", "MAX_ALIGNMENT", "MAX_TENSOR_NAME", "ValueWriter",
           "check_alignment", "check_tensor_name", "scalar_type_names"]

TYPE_IDS = {name: tid for tid, (name, _, _) in GGUF_VALUE_TYPES.items()}
# llama.cpp's GGML_MAX_NAME: a name and its terminating NUL in 64 bytes
MAX_TENSOR_NAME = 63
# The largest general.alignment written: the largest page size (64 KiB, arm64 and ppc64), the
# most an mmap needs; each tensor's data pads to it, so a larger one grows the file by up to
# that much per tensor (2 GiB on 10 tensors: a 20 GiB file)
MAX_ALIGNMENT = 1 << 16

# each GGUF integer type's range (the text of a metadata file is read in it too)
INT_RANGES = {"uint8": (0, 2**8 - 1), "int8": (-2**7, 2**7 - 1),
               "uint16": (0, 2**16 - 1), "int16": (-2**15, 2**15 - 1),
               "uint32": (0, 2**32 - 1), "int32": (-2**31, 2**31 - 1),
               "uint64": (0, 2**64 - 1), "int64": (-2**63, 2**63 - 1)}
_FLOAT_WORDS = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}
_FLOAT32_MAX = 3.4028234663852886e38


def scalar_type_names() -> tuple[str, ...]:
    """The scalar value types a key may have (an array's element types too)."""
    return tuple(name for name in TYPE_IDS if name != "array")


def check_alignment(value) -> int:
    """``general.alignment``'s value as the writer uses it; ``ValueError`` unless it is an
    int power of two from 1 to ``MAX_ALIGNMENT``."""
    if type(value) is not int or value <= 0 or value & (value - 1):
        raise ValueError(f"general.alignment must be a power of two, not {value!r}")
    if value > MAX_ALIGNMENT:
        raise ValueError(f"general.alignment {value} is more than {MAX_ALIGNMENT} (the largest "
                         "page size): each tensor would pad to it")
    return value


def check_tensor_name(name) -> str:
    """A tensor name llama.cpp loads: a non-empty str of at most ``MAX_TENSOR_NAME`` bytes
    in UTF-8, without NUL."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a tensor name is a non-empty string, not {name!r}")
    if "\0" in name:
        raise ValueError(f"tensor name {name!r} holds a NUL byte")
    size = len(name.encode("utf-8", "surrogateescape"))
    if size > MAX_TENSOR_NAME:
        raise ValueError(f"tensor name {name[:40]!r}... is {size} bytes: llama.cpp loads names "
                         f"of at most {MAX_TENSOR_NAME} (GGML_MAX_NAME)")
    return name


class ValueWriter:
    """GGUF values as bytes in one byte order (``"<"`` or ``">"``) and version."""

    def __init__(self, order: str, v1: bool):
        self.order = order
        self.len_code = "I" if v1 else "Q"

    def u32(self, n: int) -> bytes:
        return struct.pack(self.order + "I", n)

    def length(self, n: int) -> bytes:
        """A count, string length, array length or dim: u32 in v1, u64 after."""
        return struct.pack(self.order + self.len_code, n)

    def string(self, text) -> bytes:
        if not isinstance(text, str):
            raise ValueError(f"{_shown(text)} is not a string")
        try:
            data = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            data = text.encode("utf-8", "surrogatepass")
        return self.length(len(data)) + data

    def scalar(self, type_name: str, value) -> bytes:
        if type_name == "string":
            return self.string(value)
        if type_name not in TYPE_IDS or type_name == "array":
            raise ValueError(f"values of type {type_name!r} cannot be written")
        fmt = GGUF_VALUE_TYPES[TYPE_IDS[type_name]][1] or ""
        if type_name == "bool":
            if type(value) is not bool:
                raise ValueError(f"{_shown(value)} is not a bool")
        elif type_name in INT_RANGES:
            low, high = INT_RANGES[type_name]
            if type(value) is not int:
                raise ValueError(f"{_shown(value)} is not an integer")
            if not low <= value <= high:
                raise ValueError(f"{value} is out of range for {type_name} ({low} to {high})")
        else:
            value = _FLOAT_WORDS.get(value, value) if isinstance(value, str) else value
            if type(value) not in (int, float):
                raise ValueError(f"{_shown(value)} is not a number")
            if type_name == "float32" and abs(value) != float("inf") \
                    and abs(value) > _FLOAT32_MAX:
                raise ValueError(f"{value} is out of range for float32")
        return struct.pack(self.order + fmt, value)

    def array_body(self, type_name: str, items, depth: int = 1) -> bytes:
        """An array's element type, length and elements (``type_name``: ``array[T]``)."""
        if not (type_name.startswith("array[") and type_name.endswith("]")):
            raise ValueError(f"{type_name!r} is not an array type")
        if not isinstance(items, list):
            raise ValueError(f"an {type_name} is a list, not {_shown(items)}")
        if depth > MAX_ARRAY_DEPTH:
            raise ValueError(f"arrays nest at most {MAX_ARRAY_DEPTH} deep")
        inner = type_name[len("array["):-1]
        if inner.startswith("array"):
            parts = [self.u32(GGUF_ARRAY), self.length(len(items))]
            parts += [self.array_body(inner, x, depth + 1) for x in items]
            return b"".join(parts)
        if inner not in TYPE_IDS or inner == "array":
            raise ValueError(f"an {type_name} cannot be written")
        return b"".join([self.u32(TYPE_IDS[inner]), self.length(len(items))]
                        + [self.scalar(inner, x) for x in items])

    def value(self, type_name: str, value) -> bytes:
        """The value type id and the value, as stored after a key."""
        if type_name.startswith("array"):
            return self.u32(GGUF_ARRAY) + self.array_body(type_name, value)
        if type_name not in TYPE_IDS:
            raise ValueError(f"values of type {type_name!r} cannot be written")
        return self.u32(TYPE_IDS[type_name]) + self.scalar(type_name, value)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
