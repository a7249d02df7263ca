"""Assemble what one mount serves: the model's files opened, every tensor's views, the
generated files, all placed in a ``Tree`` by the naming rule.  FUSE is not involved."""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from tensorfs.budget import MemoryBudget
from tensorfs.cache import ByteLRU
from tensorfs.convert.plan import Plans, ViewPlan
from tensorfs.convert.workers import START_WORK_BYTES, WorkerPool
from tensorfs.errors import ModelError
from tensorfs.fuse.operations import Later
from tensorfs.loading.wholefiles import Companions, whole_file_directories, whole_file_views
from tensorfs.model import Model
from tensorfs.mount.longwork import LongWork
from tensorfs.mount.metadata_files import add_metadata_files
from tensorfs.mount.metadata_json import metadata_json_pieces
from tensorfs.runtime import descriptor_of, mount_device
from tensorfs.sources.local import ModelSource
from tensorfs.views.byteviews import (
    ConvertedView,
    GeneratedView,
    NpyView,
    RawView,
    npy_header,
    worker_pool,
)
from tensorfs.views.names import TensorPaths, Tree, entry_name, tensor_paths

log = logging.getLogger("tensorfs")

# A raw file up to this size is hashed in the request that asks for its sha256 xattr: the
# most one read request asks for.  A larger one is hashed in the background (TensorXattrs).
INLINE_HASH_BYTES = 1 << 20


@dataclass
class MountedModel:
    model: Model
    tree: Tree
    sources: dict[str, ModelSource]
    cache: ByteLRU
    pool: WorkerPool | None = None
    whole_files: bool = False           # files/ is served
    long_work: LongWork | None = None   # what no request waits for (the sha256 xattr)
    # generated files whose size costs generating them whole (metadata.json: O(model)):
    # learnt in the background from the start, so that a stat seldom waits for it
    measured_ahead: tuple[GeneratedView, ...] = ()
    budget: MemoryBudget | None = None  # what views made later (an edited tensor's) serve from
    converts: bool = False              # .npy views are served: converted ones need numpy

    def start(self, mountpoint: str | None = None) -> None:
        """Called in the daemon after the fork and before libfuse's threads exist: what must
        run in the serving process (worker processes) starts here, not at build time.
        ``mountpoint`` (resolved): watched while remote sources serve it (below)."""
        for source in self.sources.values():
            # a remote source's transport: its event loop thread is not copied by fork;
            # with files/, a model file's bytes are served twice (its tensors', its own)
            source.start(served_once=not self.whole_files)
        for companion in self.model.companions:
            companion.start()
        # a directory's companions say at once which files they left out (tensorfs.loading.wholefiles)
        if isinstance(self.model.companions, Companions):
            self.model.companions.say_refused()
        remote = [s.abort for s in self.sources.values() if s.remote]
        aborts = remote + ([self.long_work.stop] if self.long_work is not None else [])
        # /dev/fd/N names no entry of the mount table: nothing to watch for
        watched = mountpoint if mountpoint and descriptor_of(mountpoint) is None else None
        if watched and remote:
            _watch_detach(watched, aborts)
        elif watched and self.long_work is not None:
            # a local model's mount is watched only once an ask waits for long work
            self.long_work.on_first_job = lambda: _watch_detach(watched, aborts)
        if self.measured_ahead:
            threading.Thread(target=self._measure_ahead, name="tensorfs-sizes",
                             daemon=True).start()
        if self.pool is None:
            log.info("conversions in the daemon's threads (no worker processes)")
        else:
            log.info("%d conversion workers, started when %s", self.pool.size,
                     "a costly conversion asks" if self.pool.start_work == 0 else
                     f"a tensor of {self.pool.start_work >> 20} MiB or more is converted")
            self.pool.start()
            # in the background: the sum goes over every tensor, and the mount is live now
            threading.Thread(target=self._start_workers_ahead, name="tensorfs-workers-ahead",
                             daemon=True).start()

    def _measure_ahead(self) -> None:
        for view in self.measured_ahead:
            try:
                _ = view.size               # learnt once, kept by the view
            except Exception as error:
                log.debug("%s: size not learnt ahead: %s", view.key, error)

    def served(self) -> None:
        """Called once the mount serves (its readiness signalled, the mount command ending): a
        model with converted .npy views has numpy imported now, in a thread, before anyone
        asks.  The mount command does not wait for numpy (most of its imports), and the first
        converted read no longer pays its import (~0.1 s) either, unless it comes within that
        time (it then waits for the import under way, tensorfs.runtime.libraries)."""
        if self.converts:
            threading.Thread(target=self._import_numpy, name="tensorfs-numpy", daemon=True).start()

    def _import_numpy(self) -> None:
        plan_of = Plans()
        if any(plan_of(t).kind == "converted" for t in self.model.tensors):
            from tensorfs.runtime.libraries import np  # noqa: F401 (imported, once)

    def _start_workers_ahead(self) -> None:
        """A model with costly work enough to pay for the workers' start has them started
        now, while nobody reads yet: its first large reads find them ready."""
        costly = costly_bytes(self.model)
        if costly >= START_WORK_BYTES:
            log.info("starting the conversion workers ahead: %d MiB of costly tensors",
                     costly >> 20)
            self.pool.want()

    def stop(self) -> None:
        """The mount is ending (SIGTERM, SIGINT, an unmount; called from another thread
        while requests may still be in flight): end what could keep them or the daemon
        waiting: the background work is cancelled, remote reads that wait end with EIO.
        Conversions in flight finish (each is one chunk) and are answered."""
        if self.long_work is not None:
            self.long_work.stop()
        for view in self.measured_ahead:
            view.stop()
        for source in self.sources.values():
            source.abort()

    def close(self) -> None:
        if self.long_work is not None:
            self.long_work.close()      # before the sources it reads are closed
        if self.pool is not None:
            self.pool.close()
        for source in self.sources.values():
            source.close()
        for companion in self.model.companions:
            companion.close()


UNMOUNT_POLL_S = 0.5            # how often a watched mount checks it is still mounted


def _watch_detach(mountpoint: str, aborts) -> None:
    threading.Thread(target=_abort_when_detached, args=(mountpoint, aborts),
                     name="tensorfs-unmount-watch", daemon=True).start()


def _abort_when_detached(mountpoint: str, aborts) -> None:
    """A lazy unmount (``unmount --lazy``, ``fusermount -uz``) while a remote request hangs
    or an ask waits for long work (a sha256): the asker keeps the mount's connection open,
    so the daemon would be told nothing until the request times out or the work is done.
    Once the mount point is gone from the mount table, every remote request still waiting
    is ended (EIO) and the long work cancelled (ECANCELED): the asker lets go, the kernel
    ends the session, the daemon exits."""
    seen = False
    started = time.monotonic()
    while True:
        mounted = mount_device(mountpoint) is not None      # no stat of our own mount
        if mounted:
            seen = True
        elif seen:
            for abort in aborts:
                abort()
            return
        # until the mount shows up, look often: a mount undone right after it was made
        # must not go unseen
        fast = not seen and time.monotonic() - started < 60
        time.sleep(0.01 if fast else UNMOUNT_POLL_S)


_HASH_JOBS = itertools.count()


class TensorXattrs(Mapping):
    """user.tensorfs.* of a tensor's files, made when asked (a dict per tensor would cost
    more than the rest of the tensor's entry).

    A raw file (``raw`` given) also answers ``user.tensorfs.sha256``: the sha256 of its
    bytes, kept for the mount's life.  A file of at most ``INLINE_HASH_BYTES`` (what one
    read request may ask for) is hashed in the request that asks; a larger one by the
    mount's background thread (``long_work``), the ask answered with a ``Later`` that the
    hash settles (the request waits, no thread does).  It is not listed: whatever copies the listed
    attributes (``cp -a``, ``rsync -X``) would hash every tensor (docs/reference/facts.md)."""

    __slots__ = ("tensor", "raw", "sha256", "long_work", "_job")
    NAMES = ("user.tensorfs.dtype", "user.tensorfs.shape", "user.tensorfs.offset",
             "user.tensorfs.shard")
    SHA256 = "user.tensorfs.sha256"
    # one of these per tensor name: two threads asking for one small file hash it once
    _LOCKS = tuple(threading.Lock() for _ in range(64))

    def __init__(self, tensor, raw=None, long_work: LongWork | None = None):
        self.tensor = tensor
        self.raw = raw
        self.sha256: bytes | None = None
        self.long_work = long_work
        # this file's hash job: its own key, as an edited tensor's bytes are not the model's
        self._job: tuple | None = None

    def __getitem__(self, name: str) -> bytes | Later:
        t = self.tensor
        if name == "user.tensorfs.dtype":
            return t.dtype.encode()
        if name == "user.tensorfs.shape":
            return json.dumps(list(t.shape)).encode()
        if name == "user.tensorfs.offset":
            return str(t.offset).encode()
        if name == "user.tensorfs.shard":
            return os.path.basename(t.file).encode("utf-8", "surrogateescape")
        if name == self.SHA256 and self.raw is not None:
            return self._sha256()
        raise KeyError(name)

    def __contains__(self, name) -> bool:
        return name in self.NAMES or (name == self.SHA256 and self.raw is not None)

    def _sha256(self) -> bytes | Later:
        # at the first hash asked for: the facts layer costs a mount nothing before
        from tensorfs.facts.hashing import sha256_of

        if self.sha256 is not None:
            return self.sha256
        if self.raw.size > INLINE_HASH_BYTES and self.long_work is not None:
            raw = self.raw

            def work(check) -> bytes:
                return sha256_of(_Checked(raw, check)).encode()

            if self._job is None:
                self._job = ("sha256", self.tensor.name, next(_HASH_JOBS))
            value = self.long_work.result(self._job, work,
                                          f"sha256 of tensor {self.tensor.name!r}")
            if isinstance(value, bytes):
                self.sha256 = value
            return value
        with self._LOCKS[hash(self.tensor.name) % len(self._LOCKS)]:
            if self.sha256 is None:
                self.sha256 = sha256_of(self.raw).encode()
        return self.sha256

    def __iter__(self):
        return iter(self.NAMES)

    def __len__(self) -> int:
        return len(self.NAMES)


class _Checked:
    """A view whose every read first asks ``check()`` whether to go on (it raises to stop):
    long work over a view ends within one read of being cancelled."""

    __slots__ = ("check", "size", "view")

    def __init__(self, view, check):
        self.view, self.check, self.size = view, check, view.size

    def read_into(self, offset: int, buf) -> int:
        self.check()
        return self.view.read_into(offset, buf)


def describe(model: Model, layout: str = "tree") -> tuple[dict[str, TensorPaths], dict[str, ViewPlan]]:
    """Paths and view plans of every tensor: all that metadata.json needs besides the model."""
    paths = tensor_paths([t.name for t in model.tensors], layout)
    plan_of = Plans()
    return paths, {t.name: plan_of(t) for t in model.tensors}


# The largest size ``stat`` can tell: st_size is a signed 64-bit off_t (the kernel's
# MAX_LFS_FILESIZE).  A larger number would wrap (an exabyte view showed 128 bytes) or make
# the kernel refuse the attributes (EIO on stat).
MAX_FILE_SIZE = 2**63 - 1
# A view is at most this many times its file's bytes: float32 from the smallest stored type
# (IQ1_S, 1.5625 bits per element: x20.5) plus a .npy header (at most ~24 bytes per
# dimension, and a dimension costs the header at least a byte).
MAX_VIEW_GROWTH = 64


def check_sizes(model: Model, npy: bool = True) -> None:
    """Every size the kernel will be told fits in ``st_size``, or ``ModelError``: one line,
    at mount.  Raw files, header.bin and headers/ are parts of a file: its size must fit
    (a local one's came from fstat, so it does; a remote one's is what a server said).
    Only the .npy views can be larger than their file, and they are checked one by one
    only in a file so large that one could be (so a 100k-tensor model pays nothing)."""
    plan_of = Plans()
    for f in model.files:
        if f.file_size > MAX_FILE_SIZE:
            raise ModelError("file_size", f"the file is {f.file_size} bytes, more than a file "
                             f"can have (2**63 - 1 bytes)", file=f.path)
        if not npy or f.file_size * MAX_VIEW_GROWTH <= MAX_FILE_SIZE:
            continue
        for t in f.tensors:
            plan = plan_of(t)
            if plan.kind is None:
                continue
            data = t.nbytes if plan.kind == "native" else t.n_elements * 4
            if data + 128 + 24 * len(t.shape) > MAX_FILE_SIZE and \
                    data + len(npy_header(plan.npy_dtype, t.shape)) > MAX_FILE_SIZE:
                raise ModelError(
                    "file_size", f"tensor {t.name!r} ({t.dtype} {list(t.shape)}) would have "
                    f"a .npy view of {data} bytes of data, more than a file can have "
                    f"(2**63 - 1 bytes)", name=t.name, offset=t.offset, file=t.file)


def costly_bytes(model: Model) -> int:
    """Float32 bytes of the model's tensors whose conversion is costly (block quants)."""
    plan_of = Plans()
    total = 0
    for t in model.tensors:
        plan = plan_of(t)
        if plan.kind == "converted" and plan.conversion.costly:
            total += t.n_elements * 4
    return total


# What a mount serves (``--views``): each tensor's raw bytes, its .npy view, and files/ (the
# model's own files, whole: docs/internals/design.md).
VIEWS = ("raw", "npy", "files")
TENSOR_VIEWS = ("raw", "npy")


def build_mount(model: Model, budget: MemoryBudget, layout: str = "tree",
                views: tuple[str, ...] = VIEWS, workers: int | None = 0) -> MountedModel:
    """The tree of a mount.  Nothing here costs per tensor: metadata.json is made when first
    read, and the tensors' files when their directory is first looked into.

    ``views``: which of a tensor's files are served (a copy of the mount writes each one:
    ``cp -r`` of a quantized model's float32 views is several times the model), and whether
    ``files/`` is.  A tensor whose type has no .npy view keeps its raw file whatever
    ``views`` says, so that every tensor is still there once -- unless ``views`` names no
    tensor view at all (``--views files``: the tree of tensors is left out).

    ``budget``: the memory it serves from (tensorfs.budget), made once by the caller.
    ``workers``: conversion worker processes (0: convert in-thread; None: as many as pay,
    ``worker_pool``), started by ``MountedModel.start``."""
    unknown = set(views) - set(VIEWS)
    if unknown or not views:
        raise ValueError(f"views must be some of {VIEWS}, not {views!r}")
    serve_raw, serve_npy = "raw" in views, "npy" in views
    tensor_views = tuple(v for v in TENSOR_VIEWS if v in views)
    check_sizes(model, npy=serve_npy)
    cache = budget.cache
    pool = worker_pool(workers, budget) if serve_npy else None
    # The sources the files were parsed from (tensorfs.loading.loader.load_model): never the path
    # opened again, which may name another file by now.
    sources = dict(model.sources) or {f.path: ModelSource(f.path, f.file_size)
                                      for f in model.files}
    tree = Tree()
    long_work = LongWork()

    if model.sharded:
        for f in model.files:
            tree.add_file(f"headers/{entry_name(os.path.basename(f.path))}.bin",
                          RawView(sources[f.path], 0, f.header_size))
    else:
        f = model.files[0]
        tree.add_file("header.bin", RawView(sources[f.path], 0, f.header_size))

    if "files" in views:
        for name in whole_file_directories(model):      # a subfolder, even an empty one
            tree.add_dir("files/" + "/".join(map(entry_name, name.split("/"))))
        for name, view in whole_file_views(model, sources).items():
            tree.add_file("files/" + "/".join(map(entry_name, name.split("/"))), view)

    def produce_metadata_json():
        paths, plans = describe(model, layout)
        return metadata_json_pieces(model, paths, plans, tensor_views)

    metadata_json = GeneratedView(cache, "metadata.json", produce_metadata_json)
    tree.add_file("metadata.json", metadata_json)
    add_metadata_files(tree, model, cache)

    tensors = model.tensors
    plan_of = Plans()

    def make_files(i: int):
        tensor = tensors[i]
        plan = plan_of(tensor)
        source = sources[tensor.file]
        raw = RawView(source, tensor.offset, tensor.nbytes)
        if plan.kind == "native":
            view = NpyView(plan.npy_dtype, tensor.shape, raw)
        elif plan.kind == "converted":
            converted = ConvertedView(source, tensor.offset, tensor.nbytes, plan.conversion,
                                      budget, ("chunk", tensor.name), tensor.n_elements,
                                      pool=pool)
            view = NpyView("<f4", tensor.shape, converted)
        else:
            view = None
        if not serve_npy:
            view = None
        elif not serve_raw and view is not None:
            raw = None
        # the raw file's attributes answer its sha256 too; the view's do not
        return raw, view, (TensorXattrs(tensor, raw, long_work), TensorXattrs(tensor))

    if tensor_views:
        tree.add_tensors([t.name for t in tensors], layout, make_files)
    return MountedModel(model, tree, sources, cache, pool, whole_files="files" in views,
                        long_work=long_work, measured_ahead=(metadata_json,), budget=budget,
                        converts=serve_npy)
