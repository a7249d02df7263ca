"""Commands run at a real terminal: a pseudo-terminal (``os.openpty``) as stdin, stdout and
stderr, as a person's shell gives them, of a set size; what the terminal received comes
back as the lines a person would see."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import termios
import time

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_at_terminal(args, env=None, columns: int = 160, rows: int = 50,
                    timeout: float = 120) -> tuple[int, str]:
    """(exit status, everything written to the terminal, decoded) of ``args``."""
    main, sub = os.openpty()
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    process = subprocess.Popen(list(map(str, args)), stdin=sub, stdout=sub, stderr=sub,
                               env=env, start_new_session=True)
    os.close(sub)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.5)
            if ready:
                try:
                    data = os.read(main, 65536)
                except OSError:         # EIO: the last writer closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif process.poll() is not None:
                break
        status = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(main)
    return status, b"".join(chunks).decode("utf-8", "replace")


def seen_lines(output: str) -> list[str]:
    """The lines a person sees: for each line, what is left after its last carriage
    return (a progress bar redraws over itself), escape sequences dropped."""
    out = []
    for raw in output.replace("\r\n", "\n").split("\n"):
        text = _ANSI.sub("", raw.rsplit("\r", 1)[-1])
        if text.strip():
            out.append(text.rstrip())
    return out
