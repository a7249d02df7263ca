"""The command line (SPEC §1): mount, unmount, inspect.

Errors are one line on stderr, ``tensorfs: error: …``, exit 1 for a bad model or a runtime
failure and 2 for a usage error; a traceback only with ``--debug``.
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
import time

from tensorfs import __version__
from tensorfs.errors import ModelError, printable

log = logging.getLogger("tensorfs")

DEFAULT_CACHE_SIZE = "256M"
DEFAULT_DISK_CACHE_SIZE = "10G"
DEFAULT_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 60
UNMOUNT_WAIT_S = 30


class UserError(Exception):
    """A runtime failure the user can act on: said in one line, exit 1."""


class UsageError(Exception):
    """Exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgGtT]?)(i?[bB])?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512M, 2G)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[match.group(2).lower()]
    return int(match.group(1)) * scale


def parse_fuse_options(text: str) -> dict:
    options: dict = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        options[key] = value if sep else True
    return options


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tensorfs",
                     description="Mount a safetensors or GGUF model file as a tree of tensors.")
    parser.add_argument("--version", action="version", version=f"tensorfs {__version__}")
    parser.add_argument("--debug", action="store_true", help="tracebacks and debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    mount = sub.add_parser("mount", help="mount MODEL at MOUNTPOINT")
    mount.add_argument("model", metavar="MODEL")
    mount.add_argument("mountpoint", metavar="MOUNTPOINT")
    mount.add_argument("--foreground", "-f", action="store_true",
                       help="stay attached; Ctrl-C or SIGTERM unmounts")
    mount.add_argument("--layout", choices=("tree", "flat"), default="tree")
    mount.add_argument("--cache-size", type=parse_size, default=parse_size(DEFAULT_CACHE_SIZE),
                       metavar="SIZE", help=f"bytes of generated content kept (default {DEFAULT_CACHE_SIZE})")
    mount.add_argument("-o", dest="fuse_options", action="append", default=[], metavar="FUSEOPT,...",
                       help="extra FUSE mount options")
    mount.add_argument("--log", metavar="FILE", help="daemon log (default: in the runtime directory)")
    mount.add_argument("--debug", action="store_true", default=argparse.SUPPRESS)
    _remote_options(mount)
    mount.add_argument("--disk-cache", metavar="DIR[:SIZE]", type=parse_disk_cache,
                       help="also keep fetched blocks of a URL's files on disk, in DIR "
                            f"(default SIZE {DEFAULT_DISK_CACHE_SIZE}); reused by later mounts")

    for name in ("unmount", "umount"):
        un = sub.add_parser(name, help="unmount and wait for the daemon to exit" if name == "unmount"
                            else "alias of unmount")
        un.add_argument("mountpoint", metavar="MOUNTPOINT")
        un.add_argument("--lazy", "-z", action="store_true",
                        help="detach a busy mount now; it goes when its last user closes it")
        un.add_argument("--debug", action="store_true", default=argparse.SUPPRESS)

    inspect = sub.add_parser("inspect", help="describe MODEL without mounting it")
    inspect.add_argument("model", metavar="MODEL")
    inspect.add_argument("--json", action="store_true", help="print what metadata.json would hold")
    inspect.add_argument("--debug", action="store_true", default=argparse.SUPPRESS)
    _remote_options(inspect)
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


def parse_storage_option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"not KEY=VALUE: {text.split('=')[0]!r}")
    try:        # true, 3, 1.5, {"a": 1} as JSON gives them; anything else as text
        parsed = json.loads(value)
    except ValueError:
        parsed = value
    return key.strip(), parsed


def parse_disk_cache(text: str) -> tuple[str, int]:
    directory, sep, size = text.rpartition(":")
    if not sep or not re.fullmatch(r"\s*\d+\s*[kKmMgGtT]?(i?[bB])?\s*", size):
        directory, size = text, DEFAULT_DISK_CACHE_SIZE
    if not directory:
        raise argparse.ArgumentTypeError("--disk-cache needs a directory")
    return directory, parse_size(size)


def _storage_options(args) -> dict:
    return dict(getattr(args, "storage_options", None) or [])


def _remote_settings(args, cache_size: int):
    """How a URL's files are read (tensorfs.remote); nothing for a local file."""
    from tensorfs.location import is_url

    if not is_url(args.model):
        return None
    if args.timeout <= 0:
        raise UsageError("--timeout must be more than 0 seconds")
    from tensorfs.remote import RemoteSettings

    return RemoteSettings(storage_options=_storage_options(args), timeout=args.timeout,
                          cache_bytes=cache_size, disk_cache=getattr(args, "disk_cache", None))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        if args.command is None:
            raise UsageError("a command is required: mount, unmount or inspect (see --help)")
        if args.command == "mount":
            return cmd_mount(args)
        if args.command in ("unmount", "umount"):
            return cmd_unmount(args)
        return cmd_inspect(args)
    except UsageError as error:
        print(f"tensorfs: error: {printable(str(error))}", file=sys.stderr)
        return 2
    except (ModelError, UserError) as error:      # a ModelError's str() is its one line
        if debug:
            raise
        print(f"tensorfs: error: {printable(str(error))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    except Exception as error:
        if debug:
            raise
        print(f"tensorfs: error: internal error: {type(error).__name__}: {printable(str(error))}",
              file=sys.stderr)
        return 1


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
        model = load_model(args.model, _remote_settings(args, parse_size(DEFAULT_CACHE_SIZE)))
        model.close()                   # headers only: nothing more is read
    if args.json:
        from tensorfs.metadata_json import metadata_document, metadata_json_bytes
        from tensorfs.mounttree import describe

        paths, plans = describe(model)
        sys.stdout.buffer.write(metadata_json_bytes(metadata_document(model, paths, plans)))
        sys.stdout.flush()
        return 0
    write_report(model, sys.stdout)
    sys.stdout.flush()
    return 0


# -- mount ----------------------------------------------------------------------------------

def check_mountpoint(path: str) -> str:
    from tensorfs.runtime import mount_type

    if mount_type(path) is not None:
        raise UserError(f"{path}: already a mount point (tensorfs unmount {path} first)")
    if not os.path.exists(path):
        raise UserError(f"{path}: mount point does not exist")
    if not os.path.isdir(path):
        raise UserError(f"{path}: mount point is not a directory")
    try:
        if os.listdir(path):
            raise UserError(f"{path}: mount point is not empty")
    except PermissionError:
        raise UserError(f"{path}: mount point is not readable") from None
    return os.path.realpath(path)


def _setup_logging(log_file: str | None, debug: bool) -> None:
    handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s tensorfs[%(process)d] %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)


def _fsname(model_path: str) -> str:
    # Option values cannot hold "," or "\" safely: keep the name readable, drop the rest.
    return "tensorfs:" + re.sub(r"[^A-Za-z0-9._+-]", "_", os.path.basename(model_path))[:100]


def fuse_options(args, model_path: str) -> dict:
    options = {
        "ro": True,                    # every write is refused by the kernel with EROFS
        "attr_timeout": 86400,         # the model is immutable: attributes, names and
        "entry_timeout": 86400,        # misses are cached for a day (pages and listings
        "negative_timeout": 86400,     # stay cached across opens: tensorfs.fuse3)
        "default_permissions": True,   # the kernel checks the 0444/0555 modes
        "fsname": _fsname(model_path),
        "subtype": "tensorfs",         # shows as fuse.tensorfs in mount / mountinfo
    }
    for text in args.fuse_options:
        options.update(parse_fuse_options(text))
    return options


def cmd_mount(args) -> int:
    from tensorfs.cache import ByteLRU
    from tensorfs.loader import load_model
    from tensorfs.mounttree import build_mount
    from tensorfs.runtime import default_log_file, pid_file

    mountpoint = check_mountpoint(args.mountpoint)
    with _no_gc_while_building():
        model = load_model(args.model, _remote_settings(args, args.cache_size))
        mounted = build_mount(model, ByteLRU(args.cache_size), args.layout)
    st = mounted.sources[model.files[0].path].stat()     # the file parsed, not the path now
    options = fuse_options(args, model.source)
    debug = getattr(args, "debug", False)

    if args.foreground:
        _setup_logging(args.log, debug)
        _write_pid_file(pid_file(mountpoint))     # so that unmount waits for this process too
        try:
            return _serve(mounted, mountpoint, st, options, on_ready=None)
        finally:
            _remove_pid_file(pid_file(mountpoint))

    log_file = args.log or default_log_file(mountpoint)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the daemon
        os.close(ready_r)
        code = 1
        try:
            os.setsid()
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            _setup_logging(log_file, debug)
            _write_pid_file(pid_file(mountpoint))

            def ready():
                os.write(ready_w, b"ok")
                os.close(ready_w)

            code = _serve(mounted, mountpoint, st, options, on_ready=ready)
        except BaseException as error:
            log.exception("daemon failed")
            try:
                os.write(ready_w, f"error: {error}".encode()[:4000])
            except OSError:
                pass
        finally:
            _remove_pid_file(pid_file(mountpoint))
            os._exit(code)

    os.close(ready_w)
    message = _wait_ready(ready_r, pid)
    if message != "ok":
        raise UserError(f"{mountpoint}: mount failed: {message or 'the daemon exited'} (log: {log_file})")
    return 0


def _wait_ready(fd: int, pid: int) -> str:
    import select

    deadline = time.monotonic() + READY_TIMEOUT_S
    chunks = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            chunks.append(chunk)
            if b"".join(chunks) == b"ok":
                break
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def _serve(mounted, mountpoint: str, st, options: dict, on_ready) -> int:
    from tensorfs.fuse3 import FuseUnavailable
    from tensorfs.fusefs import serve

    log.info("mounting %s at %s (%d tensors)", mounted.model.source, mountpoint,
             len(mounted.model.tensors))
    try:
        mounted.start()
        serve(mounted.tree, mountpoint, uid=st.st_uid, gid=st.st_gid, mtime_ns=st.st_mtime_ns,
              options=options, on_ready=on_ready)
    except FuseUnavailable as error:
        raise UserError(str(error)) from None
    finally:
        mounted.close()
        log.info("unmounted %s", mountpoint)
    return 0


# -- unmount --------------------------------------------------------------------------------

def cmd_unmount(args) -> int:
    from tensorfs.runtime import mount_type, pid_file

    mountpoint = os.path.realpath(args.mountpoint) if os.path.lexists(args.mountpoint) else args.mountpoint
    kind = mount_type(mountpoint)
    if kind is None:
        raise UserError(f"{args.mountpoint}: not mounted")
    if not kind.startswith("fuse"):
        raise UserError(f"{args.mountpoint}: not a tensorfs mount ({kind})")
    pid = _read_pid(pid_file(mountpoint))
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
        _remove_pid_file(pid_file(mountpoint))    # a daemon that died (SIGKILL) left it
    elif not args.lazy:
        _wait_exit(pid)
    return 0


# -- the pid file: the daemon's pid, one line.  A daemon killed with SIGKILL leaves it behind,
#    and its pid may be reused: a process that started after the file was written is not
#    the one that wrote it (the file's mtime against /proc/PID/stat's start time).

def _write_pid_file(path: str) -> None:
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(tmp, path)


def _remove_pid_file(path: str) -> None:
    """Remove the pid file if it is this process's, or names no live daemon."""
    try:
        if _read_pid(path, check=False) in (None, os.getpid()) or _read_pid(path) is None:
            os.unlink(path)
    except OSError:
        pass


def _started_at(pid: int) -> float | None:
    """When ``pid`` started, in seconds since the epoch (to about a second: boot time is)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
    except (OSError, IndexError, ValueError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _read_pid(path: str, check: bool = True) -> int | None:
    """The daemon's pid from its pid file; None when there is none, or (``check``) when that
    process is gone or is another one that got the pid after the daemon died."""
    try:
        with open(path) as f:
            pid = int(f.read().split()[0])
        written = os.stat(path).st_mtime
    except (OSError, ValueError, IndexError):
        return None
    if not check:
        return pid
    if not _running(pid):
        return None
    started = _started_at(pid)
    if started is not None and started > written + 2:   # 2 s: boot time is whole seconds
        return None
    return pid


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphaned daemon waits for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _wait_exit(pid: int) -> None:
    deadline = time.monotonic() + UNMOUNT_WAIT_S
    while time.monotonic() < deadline:
        if not _running(pid):
            return
        time.sleep(0.01)
    raise UserError(f"daemon {pid} did not exit within {UNMOUNT_WAIT_S} s after unmount")
