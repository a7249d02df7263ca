"""The command line's arguments: every command's parser, the checks of each option's value,
what of the command line is kept out of ``ps``, and the fuse(8) helper's calling convention
(docs/reference/cli.md).  ``parse`` is what the dispatcher (``tensorfs.cli.main``) calls.
"""

from __future__ import annotations

import argparse
import json
import os
import re

from tensorfs import __version__
from tensorfs.cli.errors import UsageError
from tensorfs.sources.urls import without_secrets

DEFAULT_CACHE_SIZE = "256M"
DEFAULT_DISK_CACHE_SIZE = "10G"
DEFAULT_TIMEOUT_S = 60.0
COMMANDS = ("mount", "unmount", "umount", "inspect", "list", "hash", "stats", "diff")

MODEL_HELP = ("a .safetensors or .gguf file or a PyTorch checkpoint (the format is told from "
              "its bytes), a model.safetensors.index.json or pytorch_model.bin.index.json, a "
              "directory holding one model, the first shard "
              "of a split GGUF (…-00001-of-000NN.gguf), or a URL (https://, hf://, s3://, …)")


class Parser(argparse.ArgumentParser):
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
        name = str(action.metavar or action.dest.upper())
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
    parser = Parser(prog="tensorfs",
                     description="Mount a safetensors, GGUF or PyTorch model file as a tree of tensors.")
    parser.add_argument("--version", action="version", version=f"tensorfs {__version__}")
    parser.add_argument("--debug", action="store_true", help=TOP_DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    mount = sub.add_parser("mount", help="mount MODEL at MOUNTPOINT",
                           description="Mount MODEL at MOUNTPOINT (an empty directory) and return "
                           "once the mount is live: read-only, or editable by its owner with "
                           "--edits DIR.  MODEL is " + MODEL_HELP + ".")
    mount.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    mount.add_argument("mountpoint", metavar="MOUNTPOINT", help="an empty directory, or "
                       "/dev/fd/N: a /dev/fuse descriptor another process mounted "
                       "(docs/guide/containers.md)")
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
                       "views, metadata files) and a URL's fetched blocks, all caches together, "
                       f"e.g. 512M, 2G; {MIN_CACHE_SIZE} or more, 8M for a URL (default "
                       f"{DEFAULT_CACHE_SIZE})")
    mount.add_argument("--workers", type=worker_count, default=None, metavar="N",
                       help="processes converting quantized tensors (default: as many as pay "
                            "on this machine, none on 2 CPUs; 0: convert in the daemon's threads)")
    mount.add_argument("-o", dest="fuse_options", action="append", default=[], metavar="FUSEOPT,...",
                       help="FUSE mount options: allow_other, allow_root, max_read=N, "
                       "fsname=NAME, attr_timeout=S ... (docs/reference/cli.md); rw is refused")
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
                       help="let the mount's owner edit metadata and tensors with ordinary "
                            "tools (echo, cp, sed -i, vim ...), kept in DIR (reused by later "
                            "mounts of the same model); files/ serves the edited model "
                            "(docs/reference/editing.md); without it the mount is read-only")

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

    from tensorfs.cli.facts import add_commands  # hash, stats, diff (docs/reference/facts.md)

    add_commands(sub, MODEL_HELP, DEBUG_HELP, _remote_options)
    return parser


def _remote_options(parser) -> None:
    """What a URL as MODEL takes (docs/reference/remote.md)."""
    parser.add_argument("--storage-option", dest="storage_options", action="append", default=[],
                        metavar="KEY=VALUE", type=parse_storage_option,
                        help="an fsspec storage option for a URL (repeatable); secrets belong "
                             "in the environment or config files, not here (docs/reference/remote.md)")
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


def usage_of(parser, args, argv: list[str]) -> str | None:
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


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed (a usage error is a ``UsageError``), then its secrets hidden from
    ``ps`` before any request is made."""
    Parser.argv = argv
    args = parser.parse_args(_negative_values_joined(argv, _value_options(parser)))
    _hide_secrets(args)
    return args
