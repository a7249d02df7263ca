"""Open what the user named and hand it to the right parser.

The format is told from the bytes, never from the extension.  Only the header is read: a
prefix of the file, grown (doubling) while the parser asks for more.
"""

from __future__ import annotations

import os

from tensorfs.errors import ModelError
from tensorfs.formats import NeedMoreBytes
from tensorfs.model import Model, ModelFile

# Most headers fit in the first read; a longer one (a GGUF vocabulary can make megabytes)
# is re-read at least as far as the parser asks and four times longer than before: a few
# parses, their total cost dominated by the last.
FIRST_PREFIX_BYTES = 64 << 10
GROWTH = 4


def _read_prefix(fd: int, size: int) -> bytes:
    chunks = []
    got = 0
    while got < size:
        chunk = os.pread(fd, size - got, got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def parse_model_file(path: str) -> ModelFile:
    """Parse and validate one model file; ``ModelError`` (with ``file`` set) if refused."""
    from tensorfs.formats import gguf, safetensors

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as error:
        raise ModelError("unreadable", f"cannot open: {error.strerror}", file=path) from None
    try:
        st = os.fstat(fd)
        if not os.path.isfile(path):
            raise ModelError("not_a_file", "not a regular file", file=path)
        file_size = st.st_size
        want = min(file_size, FIRST_PREFIX_BYTES)
        prefix = _read_prefix(fd, want)
        if gguf.looks_like_gguf(prefix):
            parse = gguf.parse_gguf
        elif (safetensors.looks_like_safetensors(prefix, file_size)
              or prefix[8:4096].lstrip(b" \t\r\n")[:1] == b"{"):
            # the second test: a JSON header whose length does not fit is a truncated
            # safetensors file, and deserves the parser's precise error
            parse = safetensors.parse_safetensors
        else:
            raise ModelError("unknown_format",
                             "not a safetensors or GGUF file (unrecognised first bytes)",
                             offset=0, file=path)
        while True:
            try:
                return parse(prefix, file_size, path=path, mtime=st.st_mtime)
            except NeedMoreBytes as more:
                if len(prefix) >= file_size:     # a parser bug: it must not ask for more than the file
                    raise ModelError("truncated", "header runs past the end of the file",
                                     offset=file_size, file=path) from None
                want = min(file_size, max(more.needed, GROWTH * len(prefix)))
                prefix = _read_prefix(fd, want)
    except ModelError as error:
        if error.file is None:
            error.file = path
        raise
    except OSError as error:
        raise ModelError("unreadable", f"read failed: {error.strerror}", file=path) from None
    finally:
        os.close(fd)


def load_model(path: str) -> Model:
    """The model a mount of ``path`` serves: one file, or the shards an index, a split
    GGUF's first shard or a directory stands for (``tensorfs.shards``)."""
    from tensorfs import shards

    return shards.load(path)
