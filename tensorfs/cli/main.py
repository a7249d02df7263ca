"""The command line (docs/cli.md): mount, unmount, inspect, list.

Errors are one line on stderr, ``tensorfs: error: …``, exit 1 for a bad model or a runtime
failure and 2 for a usage error; a traceback only with ``--debug``.  The line is escaped as a
whole and bounded in length (``tensorfs.errors.one_line_bounded``): whatever name it quotes,
no control character reaches the terminal and a megabyte name makes no megabyte line.  The
daemon's life (fork, pid file, readiness, logs) is ``tensorfs.mount.daemon``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import logging
import os
import re
import stat
import subprocess
import sys
import threading

from tensorfs import __version__
from tensorfs.errors import ModelError, descriptor_limit_line, one_line_bounded, plural, printable
from tensorfs.mount.daemon import DaemonError
from tensorfs.mount.options import OptionError
from tensorfs.runtime import RuntimeDirError

# The imports inside the functions below are there for start-up time: `tensorfs --help`,
# `list` and `unmount` answer without numpy, the parsers, the transports or libfuse, and each
# command imports what it uses when it runs.

log = logging.getLogger("tensorfs")

DEFAULT_CACHE_SIZE = "256M"
DEFAULT_DISK_CACHE_SIZE = "10G"
DEFAULT_TIMEOUT_S = 60.0
COMMANDS = ("mount", "unmount", "umount", "inspect", "list", "hash", "stats", "diff")

MODEL_HELP = ("a .safetensors or .gguf file (the format is told from its bytes), a "
              "model.safetensors.index.json, a directory holding one model, the first shard "
              "of a split GGUF (…-00001-of-000NN.gguf), or a URL (https://, hf://, s3://, …)")


class UserError(Exception):
    """A runtime failure the user can act on: said in one line, exit 1."""


class UsageError(Exception):
    """A command line that cannot run: the command's usage line, then the error line; exit 2.
    ``usage``: that usage line, when the parser that refused it knows it."""

    def __init__(self, message, usage: str | None = None):
        super().__init__(message)
        self.usage = usage


class _Parser(argparse.ArgumentParser):
    argv: list[str] = []            # what is being parsed: its secrets are kept out of errors

    def error(self, message):
        raise UsageError(without_secrets(message, self.argv), usage=usage_line(self))


def usage_line(parser: argparse.ArgumentParser) -> str:
    """One line whatever the number of options (argparse's own usage of ``mount`` takes
    five): the command, ``[OPTIONS]`` and its operands, and where the rest is said."""
    if parser.prog == "tensorfs":
        return ("usage: tensorfs COMMAND ...  (COMMAND: " + ", ".join(
            c for c in COMMANDS if c != "umount") + "; tensorfs --help)")
    operands = []
    for action in parser._actions:
        if action.option_strings:
            continue
        name = action.metavar or action.dest.upper()
        operands.append(f"[{name} ...]" if action.nargs == "*" else name)
    return f"usage: {parser.prog} [OPTIONS] {' '.join(operands)}  ({parser.prog} --help)"


def _value_options(parser: argparse.ArgumentParser) -> set[str]:
    """The long options of every command that take one value (``--cache-size SIZE``)."""
    found = set()
    parsers = [parser] + [p for a in parser._actions
                          if isinstance(a, argparse._SubParsersAction) for p in a.choices.values()]
    for p in parsers:
        for action in p._actions:
            if action.nargs is None and action.option_strings:
                found.update(o for o in action.option_strings if o.startswith("--"))
    return found


def _negative_values_joined(argv: list[str], value_options: set[str]) -> list[str]:
    """``--cache-size -5G`` as ``--cache-size=-5G``: argparse takes a word that starts with
    "-" and is not a plain number for an option, and would say "expected one argument";
    joined, the option's own check says what is wrong with the value.  An abbreviation of
    the option (``--cache -5G``) counts."""
    out, i = [], 0
    while i < len(argv):
        word = argv[i]
        if (i + 1 < len(argv) and word.startswith("--") and "=" not in word
                and re.match(r"-\.?\d", argv[i + 1])
                and any(o.startswith(word) for o in value_options)):
            out.append(f"{word}={argv[i + 1]}")
            i += 2
            continue
        out.append(word)
        i += 1
    return out


def argument_secrets(argv: list[str]) -> list[str]:
    """What in ``argv`` may be a secret, whatever the spelling (``--stor KEY=VALUE``,
    ``--storage-option=KEY=VALUE``, a mistyped flag): every URL's credentials
    (``location.url_secrets``) and every VALUE of an argument holding ``=``, unless it is a
    number, true, false or null (``--storage-option anon=true`` hides nothing)."""
    from tensorfs.sources.location import is_url, url_secrets
    from tensorfs.sources.urls import is_scalar

    found = []
    for arg in argv:
        if is_url(arg):
            found += url_secrets(arg)
            continue
        rest = arg
        while "=" in rest:          # --s=KEY=VALUE: "KEY=VALUE" and "VALUE"
            rest = rest.split("=", 1)[1]
            if rest and not is_scalar(rest):
                found.append(rest)
    return sorted(set(found), key=len, reverse=True)        # the longest first


def without_secrets(text: str, argv: list[str]) -> str:
    """``text`` (an error line) with every secret of ``argv`` replaced by ``…``."""
    for secret in argument_secrets(argv):
        text = text.replace(secret, "…")
    return text


def parse_views(text: str) -> tuple[str, ...]:
    views = {v.strip() for v in text.split(",") if v.strip()}
    if not views or not views <= {"raw", "npy", "files"}:
        raise argparse.ArgumentTypeError(f"not a list of views: {text!r} (some of raw,npy,files)")
    return tuple(v for v in ("raw", "npy", "files") if v in views)


def worker_count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"not a number of processes: {text!r} (0 or more)")
    from tensorfs.convert.workers import MAX_WORKERS_PER_CPU, max_workers, usable_cpus

    if n > max_workers():
        raise argparse.ArgumentTypeError(
            f"{n} is more than this machine can use: at most {max_workers()} "
            f"({MAX_WORKERS_PER_CPU} per usable CPU, {usable_cpus()} here)")
    return n


MAX_TIMEOUT_S = 86400.0        # a day: past it a clock's wait overflows long before it helps


def timeout_seconds(text: str) -> float:
    """--timeout: finite, more than 0, at most a day (a wait of 1e10 s overflowed the
    platform's time_t inside the first request: "internal error")."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r} (more than 0, "
                                         f"at most {MAX_TIMEOUT_S:g})")
    return value


# A size as the options take it: 512M, 2G, 10GiB, 4096 (a leading "-" is matched to be
# refused as negative, not as an unknown option).
SIZE = re.compile(r"\s*(-?)(\d+)\s*([kKmMgGtT]?)(i?[bB])?\s*")


def parse_size(text: str) -> int:
    match = SIZE.fullmatch(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512M, 2G)")
    if match.group(1):
        raise argparse.ArgumentTypeError(f"{text!r}: a size cannot be negative (e.g. 512M, 2G)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[match.group(3).lower()]
    return int(match.group(2)) * scale


MIN_CACHE_SIZE = "64K"


def cache_size(text: str) -> int:
    """--cache-size: at least 64K.  The cache holds what a mount generates (metadata.json,
    .npy headers, converted chunks) and a URL's fetched blocks and read-ahead: with nothing
    kept every read would make its piece again, and a URL's reads would get no read-ahead."""
    size = parse_size(text)
    if size < parse_size(MIN_CACHE_SIZE):
        raise argparse.ArgumentTypeError(
            f"{text!r} is too small: the cache holds what the mount generates and fetches; "
            f"give {MIN_CACHE_SIZE} or more (default {DEFAULT_CACHE_SIZE})")
    return size


MOUNT_DEBUG_HELP = ("log every FUSE error and debug detail (in the daemon's log), and show the "
                    "traceback of a failure instead of one line")
DEBUG_HELP = "show the traceback of a failure instead of one line"
TOP_DEBUG_HELP = DEBUG_HELP + " (with mount: also log every FUSE error)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tensorfs",
                     description="Mount a safetensors or GGUF model file as a tree of tensors.")
    parser.add_argument("--version", action="version", version=f"tensorfs {__version__}")
    parser.add_argument("--debug", action="store_true", help=TOP_DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    mount = sub.add_parser("mount", help="mount MODEL at MOUNTPOINT",
                           description="Mount MODEL read-only at MOUNTPOINT (an empty directory) "
                           "and return once the mount is live.  MODEL is " + MODEL_HELP + ".")
    mount.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    mount.add_argument("mountpoint", metavar="MOUNTPOINT", help="an empty directory, or "
                       "/dev/fd/N: a /dev/fuse descriptor another process mounted "
                       "(docs/containers.md)")
    mount.add_argument("--foreground", "-f", action="store_true",
                       help="stay attached; Ctrl-C or SIGTERM unmounts")
    mount.add_argument("--layout", choices=("tree", "flat"), default="tree",
                       help="tree (default): a tensor a.b.c is the file a/b/c; flat: every "
                       "tensor at the top level under its full name")
    mount.add_argument("--views", type=parse_views, default=("raw", "npy", "files"),
                       metavar="raw,npy,files",
                       help="what the mount serves: each tensor's raw bytes, its .npy view, "
                       "files/ (the model's own files, whole); default all three; du of the "
                       "mount is what cp -r of it writes")
    mount.add_argument("--cache-size", type=cache_size, default=parse_size(DEFAULT_CACHE_SIZE),
                       metavar="SIZE", help="memory kept for generated content (converted .npy "
                       "views, metadata files) and a URL's fetched blocks, e.g. 512M, 2G; "
                       f"{MIN_CACHE_SIZE} or more (default {DEFAULT_CACHE_SIZE})")
    mount.add_argument("--workers", type=worker_count, default=None, metavar="N",
                       help="processes converting quantized tensors (default: as many as pay "
                            "on this machine, none on 2 CPUs; 0: convert in the daemon's threads)")
    mount.add_argument("-o", dest="fuse_options", action="append", default=[], metavar="FUSEOPT,...",
                       help="FUSE mount options: allow_other, allow_root, max_read=N, "
                       "fsname=NAME, attr_timeout=S ... (docs/cli.md); rw is refused")
    # a user's path is resolved here, where the command runs: the daemon works from "/"
    mount.add_argument("--log", metavar="FILE", type=os.path.abspath, help="daemon log "
                       "(default: in the runtime directory, removed after a clean unmount)")
    mount.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help=MOUNT_DEBUG_HELP)
    mount.add_argument("--from-mount-helper", action="store_true", help=argparse.SUPPRESS)
    _remote_options(mount)
    mount.add_argument("--disk-cache", metavar="DIR[:SIZE]", type=parse_disk_cache,
                       help="also keep fetched blocks of a URL's files on disk, in DIR "
                            f"(default SIZE {DEFAULT_DISK_CACHE_SIZE}); reused by later mounts")
    mount.add_argument("--edits", metavar="DIR", type=os.path.abspath,
                       help="let the mount's owner edit metadata and tensors, kept in DIR "
                            "(reused by later mounts of the same model); files/ serves the "
                            "edited model (docs/editing.md)")

    for name in ("unmount", "umount"):
        un = sub.add_parser(name, help="unmount and wait for the daemon to exit" if name == "unmount"
                            else "alias of unmount")
        un.add_argument("mountpoint", metavar="MOUNTPOINT", help="a tensorfs mount point")
        un.add_argument("--lazy", "-z", action="store_true",
                        help="detach a busy mount now; it goes when its last user closes it")
        un.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)

    inspect = sub.add_parser("inspect", help="describe MODEL without mounting it",
                             description="Describe MODEL without mounting it.  MODEL is "
                             + MODEL_HELP + ".")
    inspect.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    inspect.add_argument("--json", action="store_true", help="print what metadata.json would hold")
    inspect.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    _remote_options(inspect)

    listing = sub.add_parser("list", help="the live tensorfs mounts of the calling user",
                             description="One row per live tensorfs mount of the calling user: "
                             "mount point, source, daemon pid, tensor count, state.")
    listing.add_argument("--json", action="store_true", help="a JSON array of objects")
    listing.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)

    from tensorfs.cli.facts import add_commands  # hash, stats, diff (docs/facts.md)

    add_commands(sub, MODEL_HELP, DEBUG_HELP, _remote_options)
    return parser


def _remote_options(parser) -> None:
    """What a URL as MODEL takes (docs/remote.md)."""
    parser.add_argument("--storage-option", dest="storage_options", action="append", default=[],
                        metavar="KEY=VALUE", type=parse_storage_option,
                        help="an fsspec storage option for a URL (repeatable); secrets belong "
                             "in the environment or config files, not here (docs/remote.md)")
    parser.add_argument("--timeout", type=timeout_seconds, default=DEFAULT_TIMEOUT_S,
                        metavar="SECONDS",
                        help=f"longest wait for one read of a URL, retries included "
                             f"(default {DEFAULT_TIMEOUT_S:g})")


class StorageOption(tuple):
    """(KEY, value) of one --storage-option, and ``text``: the VALUE as typed."""

    text: str = ""


def parse_storage_option(text: str) -> StorageOption:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"not KEY=VALUE: {text.split('=')[0]!r}")
    try:        # true, 3, 1.5, {"a": 1} as JSON gives them; anything else as text
        parsed = json.loads(value)
    except ValueError:
        parsed = value
    except RecursionError:      # '[' * 100000: json's recursion, not an internal error
        raise argparse.ArgumentTypeError(f"{key.strip()}: the value nests deeper than "
                                         "JSON is read here") from None
    option = StorageOption((key.strip(), parsed))
    option.text = value
    return option


def _hide_secrets(args) -> None:
    """What `ps` and /proc/PID/cmdline show of this process, and of the daemon it forks,
    without the secrets it was given, however they were spelled (argparse gave each
    --storage-option's text to ``parse_storage_option``, abbreviated or not): the URL's
    credentials (``location.url_secrets``) and every storage option's VALUE but a number,
    true, false or null.  Done once the arguments are parsed, before any request."""
    from tensorfs.runtime import hide_from_cmdline
    from tensorfs.sources.urls import command_line_secrets

    options = getattr(args, "storage_options", None) or []      # not every command has it
    hide_from_cmdline(command_line_secrets(_models(args), [option.text for option in options]))


def _models(args) -> list[str]:
    """The models a command line names (diff: two; list, unmount: none)."""
    if args.command == "diff":
        return [args.a, args.b]
    model = getattr(args, "model", None)        # not every command has one
    return [model] if model else []


def parse_disk_cache(text: str) -> tuple[str, int]:
    directory, sep, size = text.rpartition(":")
    if not sep or not SIZE.fullmatch(size):
        directory, size = text, DEFAULT_DISK_CACHE_SIZE
    if not directory:
        raise argparse.ArgumentTypeError("--disk-cache needs a directory")
    nbytes = parse_size(size)
    if nbytes == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a disk cache of 0 bytes keeps nothing "
                                         f"(leave --disk-cache out, or give a SIZE: DIR:10G)")
    return os.path.abspath(directory), nbytes     # from where the command runs


def _remote_settings(args, cache):
    """How a URL's files are read (tensorfs.sources.remote); nothing for a local file.  ``cache``:
    the mount's LRU, which holds the fetched blocks too (one --cache-size)."""
    from tensorfs.sources.urls import option_problem, remote_settings

    disk_cache = getattr(args, "disk_cache", None)      # mount only
    problem = option_problem([args.model], storage_options=args.storage_options,
                             timeout=args.timeout, disk_cache=disk_cache)
    if problem is not None:
        raise UsageError(problem)
    return remote_settings(args.model, storage_options=args.storage_options,
                           timeout=args.timeout, cache=cache, disk_cache=disk_cache)


def _say_error(text: str) -> None:
    """The one error line, escaped as a whole: the last line of defence against a name
    that carries ESC or BEL to the terminal."""
    _say("error", text)


def _say(what: str, text: str) -> None:
    line = f"tensorfs: {what}: " + one_line_bounded(str(text))
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _say_usage(line: str | None) -> None:
    if line:
        try:
            sys.stderr.write(printable(line) + "\n")
        except (OSError, ValueError):
            pass


def _usage_of(parser, args, argv: list[str]) -> str | None:
    """The usage line of the command a usage error belongs to (found after parsing: an
    ``-o`` option refused, --storage-option without a URL)."""
    if parser is None:
        return None
    command = getattr(args, "command", None) or next((w for w in argv if w in COMMANDS), None)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return usage_line(action.choices[command])
    return None


def mount_helper_argv(argv: list[str]) -> list[str] | None:
    """The fuse(8) calling convention, ``SOURCE MOUNTPOINT [-o OPTS]`` (what mount.fuse3
    runs for an fstab line of type fuse.tensorfs, and mount(8) for mount.fuse.tensorfs),
    as a ``mount`` command line; None when ``argv`` is not that."""
    positional, options, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-o" and i + 1 < len(argv):
            options.append(argv[i + 1])
            i += 2
            continue
        if arg.startswith("-o") and len(arg) > 2:
            options.append(arg[2:])
        elif arg in ("-n", "-s", "-v", "-f"):       # mount(8)'s: no mtab, sloppy, verbose, fake
            pass
        elif arg == "-t" and i + 1 < len(argv):     # the type: fuse.tensorfs
            i += 1
        elif arg.startswith("-"):
            return None
        else:
            positional.append(arg)
        i += 1
    if len(positional) != 2 or positional[0] in COMMANDS:
        return None
    return ["mount", positional[0], positional[1], "--from-mount-helper"] + \
        [x for o in options for x in ("-o", o)]


def mount_helper_main() -> int:
    """``mount.fuse.tensorfs SOURCE MOUNTPOINT [-o OPTS]``: mount(8)'s helper for type
    fuse.tensorfs (an fstab line)."""
    argv = mount_helper_argv(sys.argv[1:])
    if argv is None:
        _say_error("usage: mount.fuse.tensorfs MODEL MOUNTPOINT [-o OPTIONS]")
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
    from tensorfs.mount.daemon import _Formatter
    logging.lastResort.setFormatter(_Formatter("%(message)s"))
    try:
        parser = build_parser()
        _Parser.argv = argv
        args = parser.parse_args(_negative_values_joined(argv, _value_options(parser)))
        _hide_secrets(args)
        if args.command is None:
            raise UsageError("a command is required: mount, unmount, inspect, list, hash, stats or diff "
                             "(see --help)")
        if args.command == "mount":
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
            return facts_main(args, _say_error, debug)
        return cmd_inspect(args)
    except (UsageError, OptionError) as error:
        _say_usage(_usage_of(parser, args, argv) or getattr(error, "usage", None)
                   or (usage_line(parser) if parser is not None else None))
        _say_error(error)
        return 2
    except (ModelError, UserError, DaemonError, RuntimeDirError) as error:
        # a ModelError's str() is its one line
        if debug:
            raise
        _say_error(error)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    except Exception as error:
        if debug:
            raise
        limit = descriptor_limit_line(error) if isinstance(error, OSError) else None
        _say_error(limit or f"internal error: {type(error).__name__}: {error}")
        return 1


def _exit_now(code: int) -> None:
    """The mount command's end once the daemon serves: nothing of this process is needed
    any more (the daemon has its own copy of everything), so the interpreter's teardown -
    freeing the model's objects one by one, tens of ms - is skipped."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


@contextlib.contextmanager
def _no_gc_while_building():
    """Parsing and building a tree make ~5 long-lived objects per tensor, none of them
    cyclic garbage: collection passes over them cost half the mount time of a 100k-tensor
    model (measured).  Frozen afterwards, they are never scanned again."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.freeze()


# -- inspect --------------------------------------------------------------------------------

def cmd_inspect(args) -> int:
    from tensorfs.cli.inspect import write_report
    from tensorfs.loading.loader import load_model

    with _no_gc_while_building():
        model = load_model(args.model, _remote_settings(args, None))
        model.close()                   # headers only: nothing more is read
    if args.json:
        from tensorfs.mount.metadata_json import metadata_json_pieces
        from tensorfs.mount.tree import describe

        paths, plans = describe(model)
        sys.stdout.flush()
        for piece in metadata_json_pieces(model, paths, plans):     # never one string
            sys.stdout.buffer.write(piece)
        sys.stdout.buffer.flush()
        return 0
    write_report(model, sys.stdout)
    sys.stdout.flush()
    return 0


# -- mount ----------------------------------------------------------------------------------

def check_mountpoint(path: str, model: str | None = None) -> str:
    """The mount point as the mount is known by (resolved), or a one-line refusal that says
    what to do.  ``/dev/fd/N`` is a /dev/fuse descriptor already mounted by a privileged
    mounter (docs/containers.md): no directory to check, the descriptor must be open."""
    from tensorfs.runtime import descriptor_of, mount_type

    fd = descriptor_of(path)
    if fd is not None:
        try:
            st = os.fstat(fd)
        except OSError:
            raise UserError(f"{path}: descriptor {fd} is not open (a mounter opens /dev/fuse, "
                            f"mounts it and passes the descriptor: docs/containers.md)") from None
        if not stat.S_ISCHR(st.st_mode) or st.st_rdev != os.makedev(10, 229):
            raise UserError(f"{path}: descriptor {fd} is not /dev/fuse (docs/containers.md)")
        return path
    if mount_type(path) is not None:
        raise UserError(f"{path}: already a mount point (tensorfs unmount {path} first)")
    if not os.path.exists(path):
        raise UserError(f"{path}: mount point does not exist (mkdir -p {path} first)")
    if not os.path.isdir(path):
        if model is not None and os.path.isdir(model) and not os.listdir(model):
            raise UserError(f"{path}: not a directory, and {model} is an empty "
                            f"directory: the arguments look swapped (tensorfs mount MODEL "
                            f"MOUNTPOINT)")
        raise UserError(f"{path}: not a directory: the mount point is an empty directory" +
                        (" (this file looks like a model: tensorfs mount MODEL MOUNTPOINT)"
                         if _looks_like_a_model(path) else ""))
    try:
        if os.listdir(path):
            raise UserError(f"{path}: mount point is not empty (mount on an empty directory)")
    except PermissionError:
        raise UserError(f"{path}: mount point is not readable") from None
    return os.path.realpath(path)


def _looks_like_a_model(path: str) -> bool:
    """The first bytes of a GGUF or safetensors file: only then is a file given as the mount
    point taken for a model (a text file, an empty file, /etc/passwd are not)."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return head[:4] == b"GGUF" or (len(head) == 9 and head[8:9] == b"{"
                                   and int.from_bytes(head[:8], "little") < 1 << 30)


def _fsname(model_path: str) -> str:
    # Option values cannot hold "," or "\" safely: keep the name readable, drop the rest.
    return "tensorfs:" + re.sub(r"[^A-Za-z0-9._+-]", "_", os.path.basename(model_path))[:100]


def fuse_options(args, model_path: str):
    """The mount's ``-o`` options, parsed once (``tensorfs.mount.options.MountOptions``):
    the FUSE adapter and the binding take what they need from it."""
    from tensorfs.mount import options as mountoptions

    return mountoptions.parse(args.fuse_options, fsname=_fsname(model_path),
                              from_mount_helper=getattr(args, "from_mount_helper", False))


def _editor(args, mounted):
    """--edits DIR: the edit store opened (refused in one line: someone else's directory,
    another model's edits) and the tree showing its edits; None without the option."""
    directory = getattr(args, "edits", None)
    if directory is None:
        return None
    from tensorfs.editing.compose import EditError
    from tensorfs.editing.store import EditsError, EditStore, source_identity
    from tensorfs.mount.editable import Editor, EditRefused

    try:
        store = EditStore(directory, source_identity(mounted.model, mounted.sources))
    except EditsError as error:
        raise UserError(str(error)) from None
    try:
        return Editor(mounted, store, args.layout)
    except EditError as error:
        store.close()
        raise UserError(str(error)) from None
    except EditRefused as error:            # kept edits this tree cannot show (a name taken)
        store.close()
        raise UserError(f"{directory}: its edits cannot be applied: {error.strerror}") from None


def _serve(mounted, mountpoint: str, st, options, on_ready, editor=None) -> None:
    """Runs in the serving process (the daemon, after the fork): start what must start
    there, then serve until unmounted."""
    from tensorfs.loading.wholefiles import read_bits
    from tensorfs.mount.adapter import serve
    from tensorfs.mount.fuse3 import FuseUnavailable

    log.info("mounting %s at %s (%s)", mounted.model.source, mountpoint,
             plural(len(mounted.model.tensors), "tensor"))
    try:
        mounted.start(mountpoint)
        serve(mounted.tree, mountpoint, uid=st.st_uid, gid=st.st_gid, mtime_ns=st.st_mtime_ns,
              options=options, on_ready=on_ready, on_stop=mounted.stop, editor=editor,
              file_mode=read_bits(mounted.sources.values()))     # no more than the model grants
    except FuseUnavailable as error:
        raise UserError(str(error)) from None
    finally:
        mounted.close()


def shown_source(source: str) -> str:
    """The source as ``list`` shows it: a path made absolute, or a URL without its
    credentials (``location.display_url``), "?…" standing for a query string that may hold
    a signed token."""
    from urllib.parse import urlsplit

    from tensorfs.sources.location import display_url

    if "://" not in source:
        return os.path.abspath(source)
    try:
        return display_url(source) + ("?…" if urlsplit(source).query else "")
    except ValueError:
        return source.split("://", 1)[0] + "://…"


def _served_files(model) -> dict:
    """Each file the mount serves whole, by its source's path: its name in the mount and how
    many tensors it holds (what ``list`` says of a file that changed: tensorfs.status)."""
    counts: dict[str, int] = {}
    for tensor in model.tensors:
        counts[tensor.file] = counts.get(tensor.file, 0) + 1
    files = {f.path: {"name": "files/" + os.path.basename(f.path.rstrip("/")),
                      "tensors": counts.get(f.path, 0)} for f in model.files}
    for companion in model.companions:
        files.setdefault(companion.path, {"name": f"files/{companion.name}", "tensors": 0})
    return files


def _load_fuse() -> None:
    """Import the FUSE adapter and load libfuse, for the serving process to inherit; a
    failure is left for that process to meet and say (``_serve``)."""
    try:
        from tensorfs.mount import adapter, fuse3  # noqa: F401 (loaded for the daemon)

        fuse3.libfuse()
    except Exception:                   # any exception: said where it is met again
        pass


def cmd_mount(args) -> int:
    from tensorfs.mount import daemon
    from tensorfs.runtime import descriptor_of
    from tensorfs.sources.transports import OBSTORE_SCHEMES, start_early

    inherited = daemon.inherited_descriptors()     # the caller's: the daemon closes them
    fuse_options(args, args.model)                  # a refused -o is a usage error: said first
    # A URL obstore reads, mounted in the background: the daemon reads the headers itself,
    # right after the fork, so that no helper process has to start for them (obstore's
    # runtime does not survive a fork: a process that forks reads through a helper); a
    # refusal still comes back as its one line (daemon.run_background's ``refusals``).  Not
    # with --disk-cache or --edits: what they say at mount (a server without ETags, an edits
    # directory refused) is said on the terminal by this process.
    in_daemon = (not args.foreground and args.disk_cache is None and args.edits is None
                 and args.model.split("://", 1)[0].lower() in OBSTORE_SCHEMES)
    if "://" in args.model and not in_daemon:
        start_early(args.model)
    # the daemon's FUSE modules and libfuse, loaded while the model is read (joined before
    # the fork: no thread may be importing then)
    fuse_loaded = threading.Thread(target=_load_fuse, name="tensorfs-load-fuse", daemon=True)
    fuse_loaded.start()
    from tensorfs.budget import MemoryBudget

    mountpoint = check_mountpoint(args.mountpoint, args.model)
    inherited.discard(descriptor_of(mountpoint))   # /dev/fd/N: the mount itself, kept
    debug = getattr(args, "debug", False)
    log_fd = None
    if args.log is not None or not args.foreground:
        log_path, log_fd, default_log = daemon.open_log(args.log, mountpoint)
    try:
        budget = MemoryBudget(args.cache_size)     # --cache-size, split once (budget.py)
        settings = _remote_settings(args, budget.cache)
        if in_daemon:
            loaded, info = None, {"source": shown_source(args.model)}
        else:
            loaded = _load(args, budget, settings)
            info = _mount_info(loaded[0])
    except BaseException:
        fuse_loaded.join()
        if log_fd is not None:
            os.close(log_fd)
            if default_log:
                os.unlink(log_path)      # nothing was logged: no mount was attempted
        raise

    def prepare():                      # in the daemon: the model read there
        nonlocal loaded
        loaded = _load(args, budget, settings, in_daemon=True)
        info.update(_mount_info(loaded[0]))

    def serve(on_ready):
        _, mounted, st, options, editor = loaded
        _serve(mounted, mountpoint, st, options, on_ready, editor)

    fuse_loaded.join()

    if args.foreground:
        daemon.run_foreground(serve, mountpoint, info=info, log_path=args.log, log_fd=log_fd,
                              debug=debug)
    else:
        from tensorfs.errors import ModelError

        daemon.run_background(serve, mountpoint, info=info, log_path=log_path, log_fd=log_fd,
                              default_log=default_log, inherited=inherited, debug=debug,
                              refusals=(ModelError, UserError),
                              prepare=prepare if in_daemon else None)
    return 0


def _mount_info(model) -> dict:
    """What the mount's status file says of it (``tensorfs list``)."""
    return {"source": shown_source(str(model.source)), "tensors": len(model.tensors),
            "files": _served_files(model)}


def _load(args, budget, settings, in_daemon: bool = False):
    """(model, mounted tree, the parsed file's stat, FUSE options, editor) of the mount."""
    from tensorfs.loading.loader import load_model
    from tensorfs.mount.tree import build_mount

    if in_daemon:
        from tensorfs.sources.transports import objects

        objects.serve_here()            # this process serves: obstore runs here, no helper
    with _no_gc_while_building():
        model = load_model(args.model, settings)
        for notice in settings.notices() if settings is not None else ():
            _say("warning", notice)     # tensorfs.sources.remote: what the terminal must hear once
        mounted = build_mount(model, budget, args.layout, args.views, workers=args.workers)
    st = mounted.sources[model.files[0].path].stat()     # the file parsed, not the path now
    options = fuse_options(args, model.source)
    editor = _editor(args, mounted)
    if editor is not None:
        options = dataclasses.replace(options, editable=True)
    return model, mounted, st, options, editor


# -- unmount --------------------------------------------------------------------------------

def cmd_unmount(args) -> int:
    from tensorfs.mount import daemon
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
    pid = daemon.daemon_pid(mountpoint)
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
    from tensorfs.mount import daemon
    from tensorfs.runtime import tensorfs_mounts

    rows = statuses.listing(tensorfs_mounts(os.geteuid()), daemon.daemon_pid, daemon.running)
    if args.json:
        shown = [{k: v for k, v in row.items() if k != "shown"} for row in rows]
        sys.stdout.write(json.dumps(shown, indent=2, ensure_ascii=True) + "\n")
        return 0
    if not rows:
        return 0
    table = [("MOUNTPOINT", "SOURCE", "PID", "TENSORS", "STATE")]
    for row in rows:
        table.append(tuple(printable(str(v if v is not None else "-")) for v in
                           (row["mountpoint"], row["source"], row["pid"], row["tensors"],
                            row["shown"])))
    # every column as wide as its longest cell; STATE, the long one, last and never padded
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    for r in table:
        sys.stdout.write("  ".join(f"{r[i]:<{widths[i]}}" for i in range(4)) + "  " + r[4] + "\n")
    return 0
