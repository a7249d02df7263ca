"""The errors a model file can be refused with.

Every way a parser refuses a file is a ``ModelError`` carrying a short ``kind`` (one word,
listed per format in that parser's module), a human message, the byte offset it concerns
and, where there is one, the tensor or metadata key.  The CLI turns it into the single line
``tensorfs: error: FILE: message (byte offset N)``.
"""

from __future__ import annotations

import errno
import resource


def printable(text: str) -> str:
    """``text`` safe for a terminal, on one line: every character Python does not call
    printable (C0 and C1 controls, DEL, format characters such as U+202E, line and
    paragraph separators, lone surrogates) as a Python escape (``\\x1b``, ``\\u202e``);
    the rest as is.  Used wherever a name, key, value or file name is printed."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == " " else _escape_char(ch) for ch in text)


# An error line names what it is about, and a name can be as long as the file holding it:
# a line past this many characters keeps its start (the file, what is wrong) and its end
# (the byte offset), and says how much of the middle it left out.
MAX_LINE_CHARS = 4096


def one_line_bounded(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """``text`` escaped (``printable``) and at most about ``limit`` characters long."""
    text = printable(text)
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]}...[{len(text) - 2 * keep} characters left out]...{text[-keep:]}"


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch, f"\\x{code:02x}")
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


class ModelError(Exception):
    """A model file (or a set of shards) that tensorfs refuses to serve."""

    def __init__(self, kind: str, message: str, *, offset: int | None = None,
                 name: str | None = None, file: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.offset = offset
        self.name = name
        self.file = file

    def one_line(self) -> str:
        """``FILE: what is wrong (byte offset N)`` — no newline, whatever the names hold."""
        text = self.message
        if self.offset is not None:
            text += f" (byte offset {self.offset})"
        if self.file is not None:
            text = f"{self.file}: {text}"
        return one_line_bounded(text)

    def __str__(self) -> str:
        return self.one_line()


class GGUFError(ModelError):
    """A GGUF file refused by ``tensorfs.formats.gguf``."""


class SafetensorsError(ModelError):
    """A safetensors file refused by ``tensorfs.formats.safetensors``."""


class PytorchError(ModelError):
    """A PyTorch checkpoint refused by ``tensorfs.formats.pytorch``."""


class ShardError(ModelError):
    """A set of shards that does not make one model."""


def plural(n: int, word: str) -> str:
    """A count and its noun as a message says it: "1 tensor", "2 tensors"."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def descriptor_limit_line(error: OSError) -> str | None:
    """The one line for EMFILE/ENFILE wherever it surfaced, or None for another error: the
    process's (or the system's) limit on open files, named with its number and the remedy.
    (``resource`` is imported with this module: with no descriptor left, an import fails.)"""
    if error.errno == errno.ENFILE:
        return "too many open files in the system (the kernel's fs.file-max is reached)"
    if error.errno != errno.EMFILE:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = f" (up to {hard} without root)" if soft < hard else ""
    return (f"too many open files: the limit of this process is {soft} (ulimit -n); raise "
            f"it{room}, e.g. ulimit -n {max(4096, soft * 4) if soft >= hard else hard}")
