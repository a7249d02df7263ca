"""The command line's dispatcher (docs/reference/cli.md), and the two commands that need no model:
``unmount`` and ``list``.

``main`` parses the arguments (``tensorfs.cli.parser``), runs the command (``mount``:
``tensorfs.cli.mount``; ``inspect``: ``tensorfs.cli.inspect``; ``hash``, ``stats``,
``diff``: ``tensorfs.cli.facts``) and turns what it raises into one line on stderr
(``tensorfs.cli.errors``), exit 1 for a bad model or a runtime failure and 2 for a usage
error; a traceback only with ``--debug``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys

from tensorfs.cli.daemon import DaemonError
from tensorfs.cli.errors import UsageError, UserError, say_error, say_usage
from tensorfs.cli.parser import (
    COMMANDS,
    build_parser,
    mount_helper_argv,
    parse,
    usage_line,
    usage_of,
)
from tensorfs.errors import ModelError, descriptor_limit_line, printable
from tensorfs.fuse.options import OptionError
from tensorfs.runtime import RuntimeDirError

# The imports inside the functions below are there for start-up time: `tensorfs --help`,
# `list` and `unmount` answer without numpy, the parsers, the transports or libfuse, and each
# command imports what it uses when it runs.


def mount_helper_main() -> int:
    """``mount.fuse.tensorfs SOURCE MOUNTPOINT [-o OPTS]``: mount(8)'s helper for type
    fuse.tensorfs (an fstab line)."""
    argv = mount_helper_argv(sys.argv[1:])
    if argv is None:
        say_error("usage: mount.fuse.tensorfs MODEL MOUNTPOINT [-o OPTIONS]")
        return 2
    return main(argv)


def main(argv=None) -> int:
    as_program = argv is None           # the process is this command: it may end it
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] not in COMMANDS and not argv[0].startswith("-"):
        argv = mount_helper_argv(argv) or argv
    debug = "--debug" in argv
    parser = args = None
    # a warning before the daemon's log exists (a directory's name, a companion's) goes
    # through logging's last-resort handler: escaped there too, as every line we print is
    from tensorfs.cli.daemon import _Formatter
    logging.lastResort.setFormatter(_Formatter("%(message)s"))
    try:
        parser = build_parser()
        args = parse(parser, argv)
        if args.command is None:
            raise UsageError("a command is required: mount, unmount, inspect, list, hash, stats or diff "
                             "(see --help)")
        if args.command == "mount":
            from tensorfs.cli.mount import cmd_mount

            code = cmd_mount(args)
            if as_program and not args.foreground:
                _exit_now(code)
            return code
        if args.command in ("unmount", "umount"):
            return cmd_unmount(args)
        if args.command == "list":
            return cmd_list(args)
        if args.command in ("hash", "stats", "diff"):
            from tensorfs.cli.facts import main as facts_main
            from tensorfs.cli.facts import usage_problem

            problem = usage_problem(args)
            if problem is not None:
                raise UsageError(problem)
            return facts_main(args, say_error, debug)
        from tensorfs.cli.inspect import cmd_inspect

        return cmd_inspect(args)
    except (UsageError, OptionError) as error:
        say_usage(usage_of(parser, args, argv)
                  or (error.usage if isinstance(error, UsageError) else None)
                  or (usage_line(parser) if parser is not None else None))
        say_error(error)
        return 2
    except (ModelError, UserError, DaemonError, RuntimeDirError) as error:
        # a ModelError's str() is its one line
        if debug:
            raise
        say_error(error)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    except Exception as error:
        if debug:
            raise
        limit = descriptor_limit_line(error) if isinstance(error, OSError) else None
        say_error(limit or f"internal error: {type(error).__name__}: {error}")
        return 1


def _exit_now(code: int) -> None:
    """The mount command's end once the daemon serves: nothing of this process is needed
    any more (the daemon has its own copy of everything), so the interpreter's teardown -
    freeing the model's objects one by one, tens of ms - is skipped."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


# -- unmount --------------------------------------------------------------------------------

def cmd_unmount(args) -> int:
    from tensorfs.cli import daemon
    from tensorfs.runtime import descriptor_of, mount_type

    if descriptor_of(args.mountpoint) is not None:
        pid = daemon.daemon_pid(args.mountpoint)
        raise UserError(f"{args.mountpoint}: " + (
            "no tensorfs daemon serves this descriptor" if pid is None else
            f"served by daemon {pid} through a descriptor another process mounted: unmount "
            f"the directory it mounted (umount DIR), and the daemon exits"))
    if not os.path.lexists(args.mountpoint) and mount_type(args.mountpoint) is None:
        raise UserError(f"{args.mountpoint}: no such file or directory")
    mountpoint = os.path.realpath(args.mountpoint)
    kind = mount_type(mountpoint)
    if kind is None:
        raise UserError(f"{args.mountpoint}: not mounted")
    if kind != "fuse.tensorfs":
        raise UserError(f"{args.mountpoint}: not a tensorfs mount ({kind}): not unmounted")
    # its runtime files, else the mount itself (a shell with another XDG_RUNTIME_DIR)
    pid = daemon.daemon_pid(mountpoint) or daemon.daemon_of_mount(mountpoint)
    command = ["fusermount", "-u"] + (["-z"] if args.lazy else []) + [mountpoint]
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError:
        raise UserError("fusermount not found: install fuse3") from None
    if result.returncode != 0:
        detail = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "failed"
        if "busy" in detail.lower():
            raise UserError(f"{args.mountpoint}: mount point is busy (a process is using it; "
                            f"--lazy detaches it now and unmounts when it is no longer used)")
        raise UserError(f"{args.mountpoint}: unmount failed: {detail}")
    if pid is None:
        daemon.forget(mountpoint)     # a daemon that died (SIGKILL) left its files
    elif not args.lazy:
        said = daemon.wait_exit(pid, args.mountpoint)
        if said is not None:
            sys.stderr.write(f"tensorfs: {printable(said)}\n")
    return 0


# -- list -----------------------------------------------------------------------------------

def cmd_list(args) -> int:
    import json

    from tensorfs import status as statuses
    from tensorfs.cli import daemon
    from tensorfs.runtime import tensorfs_mounts

    rows = statuses.listing(tensorfs_mounts(os.geteuid()), daemon.daemon_pid, daemon.running)
    if args.json:
        shown = [{k: v for k, v in row.items() if k != "shown"} for row in rows]
        sys.stdout.write(json.dumps(shown, indent=2, ensure_ascii=True) + "\n")
        return 0
    if not rows:
        return 0
    table: list[tuple[str, ...]] = [("MOUNTPOINT", "SOURCE", "PID", "TENSORS", "STATE")]
    for row in rows:
        table.append(tuple(printable(str(v if v is not None else "-")) for v in
                           (row["mountpoint"], row["source"], row["pid"], row["tensors"],
                            row["shown"])))
    # every column as wide as its longest cell; STATE, the long one, last and never padded
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    for i, r in enumerate(table):
        sys.stdout.write("  ".join(f"{r[i]:<{widths[i]}}" for i in range(4)) + "  " + r[4] + "\n")
        if i and rows[i - 1]["gguf"]:       # the converter's GGUF files it offers (hfgguf)
            sys.stdout.write("  offers " + printable(", ".join(rows[i - 1]["gguf"])) + "\n")
        elif i and rows[i - 1]["gguf_note"]:    # or why it offers none
            sys.stdout.write("  offers no GGUF: " + printable(rows[i - 1]["gguf_note"]) + "\n")
    return 0
