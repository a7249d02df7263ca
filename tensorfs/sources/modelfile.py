"""One model file from its source: the format told from the bytes, never from the
extension, and only the header read, as a prefix of the file grown while the parser asks
for more.  Below ``tensorfs.sources.location`` and ``tensorfs.loading.shards``, which call it for each file;
``tensorfs.loading.loader`` sits above them all.
"""

from __future__ import annotations

from tensorfs.errors import ModelError
from tensorfs.formats import NeedMoreBytes, gguf, pytorch, safetensors
from tensorfs.model import ModelFile
from tensorfs.sources.local import ModelSource
from tensorfs.sources.source import SourceError

# Most headers fit in the first read; a longer one (a GGUF vocabulary can make megabytes)
# is re-read at least as far as the parser asks and four times longer than before: a few
# parses, their total cost dominated by the last.
FIRST_PREFIX_BYTES = 64 << 10
GROWTH = 4
# The most of a file read as its header, checked before reading.  safetensors caps its own
# at 100 MB (MAX_HEADER_SIZE); GGUF has no cap, and a sparse file can make a string or a
# count of terabytes "fit" (an 8 GiB string in a sparse file was read whole, MemoryError).
# The largest real GGUF headers (256k-token vocabularies with merges) are tens of MB.
MAX_HEADER_READ = 256 << 20


def parse_source(source) -> ModelFile:
    """Parse and validate the model file ``source`` holds (any source: ``tensorfs.sources.local``);
    ``ModelError`` (with ``file`` set) if refused.  The caller keeps the source open: it is
    the one that serves what was parsed."""
    path = source.name
    try:
        file_size = source.size
        want = min(file_size, FIRST_PREFIX_BYTES)
        prefix = source.read(0, want)
        if pytorch.looks_like_pytorch(prefix):
            # a zip's list of entries is at its end: read where the parser asks, not a prefix
            return pytorch.parse_pytorch(source.read, file_size, path=path,
                                         mtime=source.stat().st_mtime)
        if gguf.looks_like_gguf(prefix):
            parse = gguf.parse_gguf
        elif (safetensors.looks_like_safetensors(prefix, file_size)
              or prefix[8:4096].lstrip(b" \t\r\n")[:1] == b"{"):
            # the second test: a JSON header whose length does not fit is a truncated
            # safetensors file, and deserves the parser's precise error
            parse = safetensors.parse_safetensors
        else:
            raise _unknown_format(prefix, file_size, path)
        mtime = source.stat().st_mtime
        while True:
            try:
                return parse(prefix, file_size, path=path, mtime=mtime)
            except NeedMoreBytes as more:
                if len(prefix) >= file_size:     # a parser bug: it must not ask for more than the file
                    raise ModelError("truncated", "header runs past the end of the file",
                                     offset=file_size, file=path) from None
                if more.needed > MAX_HEADER_READ:
                    raise ModelError("header_size", f"the header needs more than "
                                     f"{MAX_HEADER_READ} bytes ({more.needed} at least), "
                                     f"the most tensorfs reads as a header", file=path)
                grown = GROWTH * len(prefix)
                step = source.prefix_step
                if step is not None:        # a remote file: no more than header + step fetched
                    grown = min(grown, len(prefix) + step)
                want = min(file_size, MAX_HEADER_READ, max(more.needed, grown))
                prefix = source.read(0, want)
    except ModelError as error:
        if error.file is None:
            error.file = path
        if _claims_more_than_the_file(error, file_size):
            error.message += (": the file looks truncated (an interrupted download or copy?): "
                              "compare its size with the source's")
        raise
    except SourceError as error:
        # the file changed while it was parsed (ModelSource checks after every read), or a
        # remote read failed: what was parsed cannot be vouched for
        why = str(error.strerror).removeprefix(f"{path}: ")
        raise ModelError("unreadable", f"read failed: {why}", file=path) from None
    except OSError as error:
        raise ModelError("unreadable", f"read failed: {error.strerror}", file=path) from None


# The refusals where the header claims more bytes than the file has: what a download cut
# short looks like (the parsers say what runs past the end; this says what it likely means).
_PAST_THE_END = {"truncated", "count", "tensor_data", "InvalidHeaderLength"}


def _claims_more_than_the_file(error: ModelError, file_size: int) -> bool:
    if error.kind in _PAST_THE_END:
        return True
    # safetensors: the data ends elsewhere than the file does; past it (the offset is then
    # the file's size), not short of it (a file longer than its header says)
    return error.kind == "MetadataIncompleteBuffer" and error.offset == file_size


# What a newcomer may give instead of a model, told by its first bytes: say what it is.
def _unknown_format(prefix: bytes, file_size: int, path: str) -> ModelError:
    if file_size == 0:
        return ModelError("empty", "the file is empty (0 bytes), not a safetensors, GGUF or "
                          "PyTorch model", file=path)
    if prefix[:1] == b"\x80" and prefix[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return ModelError("pytorch", "a bare Python pickle, not a torch.save checkpoint (a "
                          "zip): tensorfs does not run pickles", offset=0, file=path)
    return ModelError("unknown_format",
                      "not a safetensors, GGUF or PyTorch file (unrecognised first bytes)",
                      offset=0, file=path)


def parse_model_file(path: str) -> ModelFile:
    """Parse and validate one local model file; ``ModelError`` (with ``file`` set) if refused."""
    source = ModelSource(path)
    try:
        return parse_source(source)
    finally:
        source.close()
