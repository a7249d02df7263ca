"""The command line (SPEC §1): mount, unmount, inspect, list.

Errors are one line on stderr, ``tensorfs: error: …``, exit 1 for a bad model or a runtime
failure and 2 for a usage error; a traceback only with ``--debug``.  The line is escaped as a
whole and bounded in length (``tensorfs.errors.one_line_bounded``): whatever name it quotes,
no control character reaches the terminal and a megabyte name makes no megabyte line.  The daemon's life (fork, pid file, readiness, logs) is ``tensorfs.daemon``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import re
import subprocess
import sys
import threading

from tensorfs import __version__
from tensorfs.daemon import DaemonError
from tensorfs.errors import ModelError, one_line_bounded, printable
from tensorfs.mountoptions import OptionError
from tensorfs.runtime import RuntimeDirError

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
    """Exit 2."""


class _Parser(argparse.ArgumentParser):
    argv: list[str] = []            # what is being parsed: its secrets are kept out of errors

    def error(self, message):
        raise UsageError(without_secrets(message, self.argv))


def argument_secrets(argv: list[str]) -> list[str]:
    """What in ``argv`` may be a secret, whatever the spelling (``--stor KEY=VALUE``,
    ``--storage-option=KEY=VALUE``, a mistyped flag): every URL's credentials
    (``location.url_secrets``) and every VALUE of an argument holding ``=``, unless it is a
    number, true, false or null (``--storage-option anon=true`` hides nothing)."""
    from tensorfs.location import is_url, url_secrets

    found = []
    for arg in argv:
        if is_url(arg):
            found += url_secrets(arg)
            continue
        rest = arg
        while "=" in rest:          # --s=KEY=VALUE: "KEY=VALUE" and "VALUE"
            rest = rest.split("=", 1)[1]
            if rest and not _scalar(rest):
                found.append(rest)
    return sorted(set(found), key=len, reverse=True)        # the longest first


def _scalar(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return value is None or isinstance(value, (bool, int, float))


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
    return n


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgGtT]?)(i?[bB])?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512M, 2G)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[match.group(2).lower()]
    return int(match.group(1)) * scale


DEBUG_HELP = ("log every FUSE error and debug detail, and show the traceback of a failure "
              "instead of one line")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tensorfs",
                     description="Mount a safetensors or GGUF model file as a tree of tensors.")
    parser.add_argument("--version", action="version", version=f"tensorfs {__version__}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    mount = sub.add_parser("mount", help="mount MODEL at MOUNTPOINT",
                           description="Mount MODEL read-only at MOUNTPOINT (an empty directory) "
                           "and return once the mount is live.  MODEL is " + MODEL_HELP + ".")
    mount.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    mount.add_argument("mountpoint", metavar="MOUNTPOINT", help="an empty directory")
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
    mount.add_argument("--cache-size", type=parse_size, default=parse_size(DEFAULT_CACHE_SIZE),
                       metavar="SIZE", help="memory kept for generated content (converted .npy "
                       f"views, metadata files), e.g. 512M, 2G (default {DEFAULT_CACHE_SIZE})")
    mount.add_argument("--workers", type=worker_count, default=None, metavar="N",
                       help="processes converting quantized tensors (default: as many as pay "
                            "on this machine, none on 2 CPUs; 0: convert in the daemon's threads)")
    mount.add_argument("-o", dest="fuse_options", action="append", default=[], metavar="FUSEOPT,...",
                       help="FUSE mount options: allow_other, allow_root, max_read=N, "
                       "fsname=NAME, attr_timeout=S ... (docs/cli.md); rw is refused")
    # a user's path is resolved here, where the command runs: the daemon works from "/"
    mount.add_argument("--log", metavar="FILE", type=os.path.abspath, help="daemon log "
                       "(default: in the runtime directory, removed after a clean unmount)")
    mount.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    mount.add_argument("--from-mount-helper", action="store_true", help=argparse.SUPPRESS)
    _remote_options(mount)
    mount.add_argument("--disk-cache", metavar="DIR[:SIZE]", type=parse_disk_cache,
                       help="also keep fetched blocks of a URL's files on disk, in DIR "
                            f"(default SIZE {DEFAULT_DISK_CACHE_SIZE}); reused by later mounts")

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

    from tensorfs.facts_commands import add_commands       # hash, stats, diff (SPEC §12)

    add_commands(sub, MODEL_HELP, DEBUG_HELP, _remote_options)
    return parser


def _remote_options(parser) -> None:
    """What a URL as MODEL takes (SPEC §8, docs/remote.md)."""
    parser.add_argument("--storage-option", dest="storage_options", action="append", default=[],
                        metavar="KEY=VALUE", type=parse_storage_option,
                        help="an fsspec storage option for a URL (repeatable); secrets belong "
                             "in the environment or config files, not here (docs/remote.md)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
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
    option = StorageOption((key.strip(), parsed))
    option.text = value
    return option


def _hide_secrets(args) -> None:
    """What `ps` and /proc/PID/cmdline show of this process, and of the daemon it forks,
    without the secrets it was given, however they were spelled (argparse gave each
    --storage-option's text to ``parse_storage_option``, abbreviated or not): the URL's
    credentials (``location.url_secrets``) and every storage option's VALUE but a number,
    true, false or null.  Done once the arguments are parsed, before any request."""
    from tensorfs.location import is_url, url_secrets
    from tensorfs.runtime import hide_from_cmdline

    model = getattr(args, "model", None)
    secrets = url_secrets(model) if model and is_url(model) else []
    secrets += [option.text for option in getattr(args, "storage_options", None) or []
                if not _scalar(option.text)]
    hide_from_cmdline(secrets)


def parse_disk_cache(text: str) -> tuple[str, int]:
    directory, sep, size = text.rpartition(":")
    if not sep or not re.fullmatch(r"\s*\d+\s*[kKmMgGtT]?(i?[bB])?\s*", size):
        directory, size = text, DEFAULT_DISK_CACHE_SIZE
    if not directory:
        raise argparse.ArgumentTypeError("--disk-cache needs a directory")
    return os.path.abspath(directory), parse_size(size)     # from where the command runs


def _storage_options(args) -> dict:
    return dict(getattr(args, "storage_options", None) or [])


def _remote_settings(args, cache):
    """How a URL's files are read (tensorfs.remote); nothing for a local file.  ``cache``:
    the mount's LRU, which holds the fetched blocks too (one --cache-size)."""
    from tensorfs.location import is_url

    if not is_url(args.model):
        if args.storage_options or getattr(args, "disk_cache", None):
            raise UsageError("--storage-option and --disk-cache apply to a URL only")
        return None
    if not args.timeout > 0:
        raise UsageError("--timeout must be more than 0 seconds")
    from tensorfs.remote import RemoteSettings

    return RemoteSettings(storage_options=_storage_options(args), timeout=args.timeout,
                          cache=cache, disk_cache=getattr(args, "disk_cache", None))


def _say_error(text: str) -> None:
    """The one error line, escaped as a whole: the last line of defence against a name
    that carries ESC or BEL to the terminal."""
    line = "tensorfs: error: " + one_line_bounded(str(text))
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


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
    try:
        parser = build_parser()
        _Parser.argv = argv
        args = parser.parse_args(argv)
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
            from tensorfs.facts_commands import main as facts_main

            options = getattr(args, "storage_options", None) or []
            return facts_main(args, _say_error, debug, [option.text for option in options])
        return cmd_inspect(args)
    except (UsageError, OptionError) as error:
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
        _say_error(f"internal error: {type(error).__name__}: {error}")
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
    from tensorfs.inspect import write_report
    from tensorfs.loader import load_model

    with _no_gc_while_building():
        model = load_model(args.model, _remote_settings(args, None))
        model.close()                   # headers only: nothing more is read
    if args.json:
        from tensorfs.metadata_json import metadata_json_pieces
        from tensorfs.mounttree import describe

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
    from tensorfs.runtime import mount_type

    if mount_type(path) is not None:
        raise UserError(f"{path}: already a mount point (tensorfs unmount {path} first)")
    if not os.path.exists(path):
        raise UserError(f"{path}: mount point does not exist")
    if not os.path.isdir(path):
        if model is not None and os.path.isdir(model) and not os.listdir(model):
            raise UserError(f"{path}: mount point is not a directory, and {model} is an empty "
                            f"directory: the arguments look swapped (tensorfs mount MODEL "
                            f"MOUNTPOINT)")
        raise UserError(f"{path}: mount point is not a directory" +
                        (" (it looks like a model: tensorfs mount MODEL MOUNTPOINT)"
                         if os.path.isfile(path) else ""))
    try:
        if os.listdir(path):
            raise UserError(f"{path}: mount point is not empty")
    except PermissionError:
        raise UserError(f"{path}: mount point is not readable") from None
    return os.path.realpath(path)


def _fsname(model_path: str) -> str:
    # Option values cannot hold "," or "\" safely: keep the name readable, drop the rest.
    return "tensorfs:" + re.sub(r"[^A-Za-z0-9._+-]", "_", os.path.basename(model_path))[:100]


def fuse_options(args, model_path: str):
    """The mount's ``-o`` options, parsed once (``tensorfs.mountoptions.MountOptions``):
    the FUSE adapter and the binding take what they need from it."""
    from tensorfs import mountoptions

    return mountoptions.parse(args.fuse_options, fsname=_fsname(model_path),
                              from_mount_helper=getattr(args, "from_mount_helper", False))


def _serve(mounted, mountpoint: str, st, options, on_ready) -> None:
    """Runs in the serving process (the daemon, after the fork): start what must start
    there, then serve until unmounted."""
    from tensorfs.fuse3 import FuseUnavailable
    from tensorfs.fusefs import serve

    log.info("mounting %s at %s (%d tensors)", mounted.model.source, mountpoint,
             len(mounted.model.tensors))
    try:
        mounted.start(mountpoint)
        serve(mounted.tree, mountpoint, uid=st.st_uid, gid=st.st_gid, mtime_ns=st.st_mtime_ns,
              options=options, on_ready=on_ready)
    except FuseUnavailable as error:
        raise UserError(str(error)) from None
    finally:
        mounted.close()


def shown_source(source: str) -> str:
    """The source as ``list`` shows it: a path made absolute, or a URL without its
    credentials (``location.display_url``), "?…" standing for a query string that may hold
    a signed token."""
    from urllib.parse import urlsplit

    from tensorfs.location import display_url

    if "://" not in source:
        return os.path.abspath(source)
    try:
        return display_url(source) + ("?…" if urlsplit(source).query else "")
    except ValueError:
        return source.split("://", 1)[0] + "://…"


def _load_fuse() -> None:
    """Import the FUSE adapter and load libfuse, for the serving process to inherit; a
    failure is left for that process to meet and say (``_serve``)."""
    try:
        from tensorfs import fuse3, fusefs  # noqa: F401

        fuse3.libfuse()
    except Exception:                   # noqa: BLE001 - said where it is met again
        pass


def cmd_mount(args) -> int:
    from tensorfs import daemon
    from tensorfs.transports import OBSTORE_SCHEMES, start_early

    inherited = daemon.inherited_descriptors()     # the caller's: the daemon closes them
    # A URL obstore reads, mounted in the background: the daemon reads the headers itself,
    # right after the fork, so that no helper process has to start for them (obstore's
    # runtime does not survive a fork: a process that forks reads through a helper); a
    # refusal still comes back as its one line (daemon.run_background's ``refusals``).
    in_daemon = not args.foreground and args.model.split("://", 1)[0].lower() in OBSTORE_SCHEMES
    if "://" in args.model and not in_daemon:
        start_early(args.model)
    # the daemon's FUSE modules and libfuse, loaded while the model is read (joined before
    # the fork: no thread may be importing then)
    fuse_loaded = threading.Thread(target=_load_fuse, name="tensorfs-load-fuse", daemon=True)
    fuse_loaded.start()
    from tensorfs.cache import ByteLRU

    mountpoint = check_mountpoint(args.mountpoint, args.model)
    debug = getattr(args, "debug", False)
    log_fd = None
    if args.log is not None or not args.foreground:
        log_path, log_fd, default_log = daemon.open_log(args.log, mountpoint)
    try:
        cache = ByteLRU(args.cache_size)
        settings = _remote_settings(args, cache)
        if in_daemon:
            fuse_options(args, args.model)      # a bad -o is said here (exit 2), not after the fork
            loaded, info = None, {"source": shown_source(args.model)}
        else:
            loaded = _load(args, cache, settings)
            info = {"source": shown_source(str(loaded[0].source)),
                    "tensors": len(loaded[0].tensors)}
    except BaseException:
        if log_fd is not None:
            os.close(log_fd)
            if default_log:
                os.unlink(log_path)      # nothing was logged: no mount was attempted
        raise

    def prepare():                      # in the daemon: the model read there
        nonlocal loaded
        loaded = _load(args, cache, settings, in_daemon=True)
        info.update(source=shown_source(str(loaded[0].source)), tensors=len(loaded[0].tensors))

    def serve(on_ready):
        _, mounted, st, options = loaded
        _serve(mounted, mountpoint, st, options, on_ready)

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


def _load(args, cache, settings, in_daemon: bool = False):
    """(model, mounted tree, the parsed file's stat, FUSE options) of the mount."""
    from tensorfs.loader import load_model
    from tensorfs.mounttree import build_mount

    if in_daemon:
        from tensorfs.transports import objects

        objects.serve_here()            # this process serves: obstore runs here, no helper
    with _no_gc_while_building():
        model = load_model(args.model, settings)
        mounted = build_mount(model, cache, args.layout, args.views, workers=args.workers)
    st = mounted.sources[model.files[0].path].stat()     # the file parsed, not the path now
    return model, mounted, st, fuse_options(args, model.source)


# -- unmount --------------------------------------------------------------------------------

def cmd_unmount(args) -> int:
    from tensorfs import daemon
    from tensorfs.runtime import mount_type

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
        daemon.wait_exit(pid)
    return 0


# -- list -----------------------------------------------------------------------------------

def cmd_list(args) -> int:
    import json

    from tensorfs import daemon, status as statuses
    from tensorfs.runtime import tensorfs_mounts

    rows = []
    for mountpoint in tensorfs_mounts(os.geteuid()):
        status = statuses.read(mountpoint, daemon.running) or {}
        pid = daemon.daemon_pid(mountpoint)
        if pid is None and status:
            state, reason = "daemon gone", "the daemon exited: tensorfs unmount it"
        elif pid is None or status.get("pid") != pid:
            state, reason = "unknown", "no status in this user's runtime directory"
            status = {}
        else:
            state, reason = status.get("state", "unknown"), status.get("reason")
        rows.append({"mountpoint": mountpoint, "source": status.get("source"), "pid": pid,
                     "tensors": status.get("tensors"), "state": state, "reason": reason,
                     "log": status.get("log")})
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=2, ensure_ascii=True) + "\n")
        return 0
    if not rows:
        return 0
    table = [("MOUNTPOINT", "SOURCE", "PID", "TENSORS", "STATE")]
    for row in rows:
        state = row["state"] + (f": {row['reason']}" if row["reason"] else "")
        table.append(tuple(printable(str(v if v is not None else "-")) for v in
                           (row["mountpoint"], row["source"], row["pid"], row["tensors"], state)))
    widths = [min(60, max(len(r[i]) for r in table)) for i in range(4)]
    for r in table:
        sys.stdout.write("  ".join(f"{r[i]:<{widths[i]}}" for i in range(4)) + "  " + r[4] + "\n")
    return 0
