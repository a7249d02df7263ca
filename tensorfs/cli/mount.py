"""``tensorfs mount`` (docs/reference/cli.md): the mount point checked, the model loaded and its tree
built in this process, then served by a daemon forked from it (``tensorfs.cli.daemon``: the
daemon's life, its pid file, readiness and log) or in the foreground.

The imports inside the functions are there for start-up time: a refused mount point is
said before numpy, the parsers or libfuse are loaded.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import stat
import threading

from tensorfs.cli.errors import UserError, say
from tensorfs.cli.models import no_gc_while_building, settings_of
from tensorfs.errors import plural
from tensorfs.sources.urls import shown_source

log = logging.getLogger("tensorfs")


def check_mountpoint(path: str, model: str | None = None) -> str:
    """The mount point as the mount is known by (resolved), or a one-line refusal that says
    what to do.  ``/dev/fd/N`` is a /dev/fuse descriptor already mounted by a privileged
    mounter (docs/guide/containers.md): no directory to check, the descriptor must be open."""
    from tensorfs.runtime import descriptor_of, mount_type

    fd = descriptor_of(path)
    if fd is not None:
        try:
            st = os.fstat(fd)
        except OSError:
            raise UserError(f"{path}: descriptor {fd} is not open (a mounter opens /dev/fuse, "
                            f"mounts it and passes the descriptor: docs/guide/containers.md)") from None
        if not stat.S_ISCHR(st.st_mode) or st.st_rdev != os.makedev(10, 229):
            raise UserError(f"{path}: descriptor {fd} is not /dev/fuse (docs/guide/containers.md)")
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
    """The mount's ``-o`` options, parsed once (``tensorfs.fuse.options.MountOptions``):
    the FUSE adapter and the binding take what they need from it."""
    from tensorfs.fuse import options as mountoptions

    return mountoptions.parse(args.fuse_options, fsname=_fsname(model_path),
                              from_mount_helper=getattr(args, "from_mount_helper", False))


def _editor(args, mounted):
    """--edits DIR: the edit store opened (refused in one line: someone else's directory,
    another model's edits) and the tree showing its edits; None without the option."""
    directory = getattr(args, "edits", None)
    if directory is None:
        return None
    if mounted.model.files[0].format == "pytorch":
        raise UserError(f"{mounted.model.source}: --edits does not apply to a PyTorch "
                        "checkpoint (docs/reference/pytorch.md): copy files/*.safetensors out of a "
                        "mount and mount that copy with --edits")
    from tensorfs.editing.compose import EditError
    from tensorfs.editing.session import EditRefused
    from tensorfs.editing.store import EditsError, EditStore, source_identity
    from tensorfs.mount.editable import Editor

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
    from tensorfs.fuse.loader import FuseUnavailable
    from tensorfs.loading.wholefiles import read_bits
    from tensorfs.mount.adapter import serve

    log.info("mounting %s at %s (%s)", mounted.model.source, mountpoint,
             plural(len(mounted.model.tensors), "tensor"))
    def ready():
        on_ready()
        mounted.served()

    try:
        mounted.start(mountpoint)
        serve(mounted.tree, mountpoint, uid=st.st_uid, gid=st.st_gid, mtime_ns=st.st_mtime_ns,
              options=options, on_ready=ready, on_stop=mounted.stop, editor=editor,
              file_mode=read_bits(mounted.sources.values()))     # no more than the model grants
    except FuseUnavailable as error:
        raise UserError(str(error)) from None
    finally:
        mounted.close()


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
        from tensorfs.fuse import loader
        from tensorfs.mount import adapter  # noqa: F401 (loaded for the daemon)

        loader.libfuse()
    except Exception:                   # any exception: said where it is met again
        pass


def cmd_mount(args) -> int:
    from tensorfs.cli import daemon
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
    from tensorfs.budget import MemoryBudget, remote_problem

    mountpoint = check_mountpoint(args.mountpoint, args.model)
    inherited.discard(descriptor_of(mountpoint))   # /dev/fd/N: the mount itself, kept
    debug = getattr(args, "debug", False)
    log_fd = None
    if args.log is not None or not args.foreground:
        log_path, log_fd, default_log = daemon.open_log(args.log, mountpoint)
    try:
        budget = MemoryBudget(args.cache_size)     # --cache-size, split once (budget.py)
        settings = settings_of(args, budget.cache)
        problem = remote_problem(args.cache_size) if settings is not None else None
        if problem is not None:
            raise UserError(problem)
        if in_daemon:
            loaded, info = None, {"source": shown_source(args.model)}
        else:
            loaded = _load(args, budget, settings)
            info = _mount_info(loaded[0], args.model)
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
        info.update(_mount_info(loaded[0], args.model))

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


def _mount_info(model, named: str) -> dict:
    """What the mount's status file says of it (``tensorfs list``): the source as the user
    named it (a directory, an index, a repository; not the file it resolved to)."""
    from tensorfs.loading.wholefiles import Companions

    info = {"source": shown_source(named), "tensors": len(model.tensors),
            "files": _served_files(model)}
    if isinstance(model.companions, Companions) and model.companions.gguf_files:
        info["gguf"] = [f"files/{f.name}" for f in model.companions.gguf_files]
    if isinstance(model.companions, Companions) and model.companions.gguf_note:
        info["gguf_note"] = model.companions.gguf_note
    return info


def _load(args, budget, settings, in_daemon: bool = False):
    """(model, mounted tree, the parsed file's stat, FUSE options, editor) of the mount."""
    from tensorfs.loading.loader import load_model
    from tensorfs.mount.tree import build_mount

    if in_daemon:
        from tensorfs.sources.transports import objects

        objects.serve_here()            # this process serves: obstore runs here, no helper
    with no_gc_while_building():
        model = load_model(args.model, settings, budget.cache)
        for notice in settings.notices() if settings is not None else ():
            say("warning", notice)     # tensorfs.sources.remote: what the terminal must hear once
        mounted = build_mount(model, budget, args.layout, args.views, workers=args.workers)
    st = mounted.sources[model.files[0].path].stat()     # the file parsed, not the path now
    options = fuse_options(args, model.source)
    editor = _editor(args, mounted)
    if editor is not None:
        options = dataclasses.replace(options, editable=True)
    return model, mounted, st, options, editor
