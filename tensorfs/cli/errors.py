"""How the command line fails: a ``UserError`` (exit 1) or a ``UsageError`` (exit 2), each
said as one line on stderr, escaped as a whole and bounded in length
(``tensorfs.errors.one_line_bounded``): whatever name it quotes, no control character
reaches the terminal and a megabyte name makes no megabyte line.
"""

from __future__ import annotations

import sys

from tensorfs.errors import one_line_bounded, printable


class UserError(Exception):
    """A runtime failure the user can act on: said in one line, exit 1."""


class UsageError(Exception):
    """A command line that cannot run: the command's usage line, then the error line; exit 2.
    ``usage``: that usage line, when the parser that refused it knows it."""

    def __init__(self, message, usage: str | None = None):
        super().__init__(message)
        self.usage = usage


def say_error(text: object) -> None:
    """The one error line, escaped as a whole: the last line of defence against a name
    that carries ESC or BEL to the terminal."""
    say("error", text)


def say(what: str, text: object) -> None:
    line = f"tensorfs: {what}: " + one_line_bounded(str(text))
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def say_usage(line: str | None) -> None:
    if line:
        try:
            sys.stderr.write(printable(line) + "\n")
        except (OSError, ValueError):
            pass
