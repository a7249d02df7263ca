"""What ``ps`` shows of this process: secrets overwritten where ``/proc/PID/cmdline`` reads
the command line from (``hide_from_cmdline``)."""

from __future__ import annotations


def hide_from_cmdline(secrets: list[str]) -> None:
    """Overwrite ``secrets`` with ``*`` where ``/proc/PID/cmdline`` reads the command line
    from: this process's own argument memory (``arg_start``..``arg_end`` in
    ``/proc/self/stat``), as setproctitle does.  The daemon is a fork of this process and
    shows what it shows; done right after the arguments are parsed, before any request.
    Best effort: where the memory is not what cmdline shows, nothing is touched."""
    import ctypes  # only with a secret to hide: runtime is on every command's path

    wanted = [s.encode("utf-8", "surrogateescape") for s in secrets if s]
    if not wanted:
        return
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])      # fields 48, 49: arg_start, arg_end
        with open("/proc/self/cmdline", "rb") as f:
            shown = f.read()
        if end <= start or ctypes.string_at(start, end - start) != shown:
            return
        for secret in wanted:
            at = shown.find(secret)
            while at >= 0:
                ctypes.memmove(start + at, b"*" * len(secret), len(secret))
                at = shown.find(secret, at + len(secret))
    except (OSError, ValueError, IndexError):
        pass
