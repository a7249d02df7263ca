"""The edit session of one mounted model (``--edits DIR``, docs/reference/editing.md): the edits in
model terms, knowing nothing of the mount's tree.

``EditSession`` holds the state (``EditState``, kept by the ``EditStore``), composes the
edited model files (a ``Composer`` per file, the files composed for the current state kept),
checks the state kept in DIR at mount (``check_kept``), and makes each edit: set, delete,
rename or re-type a key (its text read in its type, ``formats.metadata_text.parse_text``),
replace a tensor's bytes (raw bytes of its size, or an array stored in its type), remove and
rename tensors.  Each edit is checked (the format must hold it: ``EditRefused`` EINVAL
otherwise), kept by the store (atomically), and returned as a ``Committed``: the state kept
and the files it composes to.  The mount's tree side (``tensorfs.mount.editable.Editor``)
calls in with model names (keys, tensors' original names) and shows what came back.

Errors are ``EditRefused(errno, why)``: the why is logged, the errno answered.
"""

from __future__ import annotations

import errno
import io
import json
import threading
from typing import NamedTuple

from tensorfs.editing.compose import ComposedFile, Composer, EditError, encode_array
from tensorfs.editing.store import EditsError, EditState, EditStore, PendingData, TensorEdit
from tensorfs.formats.metadata_text import TextError, parse_text, valid_type
from tensorfs.model import Model, TensorInfo
from tensorfs.sources.source import Source


class EditRefused(OSError):
    """An edit refused: ``errno`` answered, the message logged."""

    def __init__(self, code: int, why: str):
        super().__init__(code, why)


class Committed(NamedTuple):
    """What an edit changed: the state now kept, and path -> the model file composed for it
    (every file of the model)."""

    state: EditState
    files: dict[str, ComposedFile]


Typed = tuple[str, object]      # a key's (type name, value as MetadataValue.value() gives it)


class EditSession:
    """The edits of one model (one file, shards or splits): ``sources`` are its files'
    bytes by path, ``store`` the edit store in DIR.  ``lock``: one change at a time (held
    by the caller around each edit and each compose; re-entrant)."""

    def __init__(self, model: Model, sources: dict[str, Source], store: EditStore):
        self.model = model
        self.files = model.files
        # the file whose metadata is edited: the one file, or a split GGUF's first (its KVs
        # are the model's); a sharded safetensors model's metadata is its index's, not edited
        self.model_file = model.files[0]
        self.format = self.model_file.format
        self.metadata_editable = self.format == "gguf" or len(model.files) == 1
        self.store = store
        self.lock = threading.RLock()
        headers = {f.path: sources[f.path].read(0, f.header_size) for f in model.files}
        self.composers = {f.path: Composer(f, headers[f.path], sources[f.path], store.data)
                          for f in model.files}
        self.by_name: dict[str, TensorInfo] = {t.name: t for t in model.tensors}
        self.index = self._read_index()
        self._composed: tuple[EditState, dict[str, ComposedFile]] = (
            store.state, self.check_kept())

    @property
    def state(self) -> EditState:
        return self.store.state

    # -- checking and composing --------------------------------------------------------------
    def check_kept(self) -> dict[str, ComposedFile]:
        """The edits kept in DIR, checked against the model as strictly as a model's header
        is (DIR is input: a hand-edited journal, a data file gone or cut short): the files
        they compose to, or ``EditError`` naming what is wrong, in one line."""
        state = self.store.state
        where = f"{self.store.root}/edits.json"
        if state.metadata and not self.metadata_editable:
            raise EditError(f"{where}: edits a sharded safetensors model's metadata (its "
                            "index's, which is not edited)")
        fmt = self.format
        for key, typed in state.metadata.items():
            if typed is None:
                if key not in self.model_file.metadata:
                    raise EditError(f"{where}: deletes {key!r}, which the model does not have")
            elif not valid_type(typed[0], fmt):
                raise EditError(f"{where}: {key!r} has type {typed[0]!r}, not a metadata type "
                                f"of a {fmt} model")
        names: dict[str, str] = {}
        for t in self.model.tensors:
            edit = state.tensors.get(t.name)
            name = t.name if edit is None else edit.name
            if name is not None and names.setdefault(name, t.name) != t.name:
                raise EditError(f"{where}: two tensors are named {name!r}")
        for original, edit in state.tensors.items():
            t = self.by_name.get(original)
            if t is None:
                raise EditError(f"{where}: edits tensor {original!r}, which the model does "
                                "not have")
            if edit.data is None:
                continue
            try:
                self.store.data(edit.data, t.nbytes)
            except EditsError as error:
                raise EditError(f"{error} (the new bytes of {original!r})") from None
            except OSError as error:
                raise EditError(f"{where}: the new bytes of {original!r} cannot be opened "
                                f"({edit.data}: {error.strerror})") from None
        try:
            return self._compose_all(state)
        except (EditError, TextError) as error:
            raise EditError(f"{where}: {error}") from None

    def _compose_all(self, state: EditState) -> dict[str, ComposedFile]:
        """path -> ComposedFile of every model file.  Metadata edits go to the metadata
        file; a split GGUF's ``split.tensors.count`` follows the tensors removed."""
        out = {}
        for f in self.files:
            if f is self.model_file:
                file_state = state
                count = f.metadata.get("split.tensors.count")
                if count is not None and len(self.files) > 1:
                    total = sum(1 for t in self.model.tensors
                                if state.tensors.get(t.name, TensorEdit(t.name)).name is not None)
                    if count.value() != total:
                        file_state = state.with_metadata("split.tensors.count",
                                                         (count.type_name, total))
            else:
                file_state = EditState({}, state.tensors)     # its composer keeps its layout
            out[f.path] = self.composers[f.path].compose(file_state)
        return out

    def composed(self, path: str | None = None, state: EditState | None = None) -> ComposedFile:
        """The model file ``path`` (the metadata file by default) composed for ``state``
        (the current one by default)."""
        return self.composed_all(state)[path or self.model_file.path]

    def composed_all(self, state: EditState | None = None) -> dict[str, ComposedFile]:
        state = self.store.state if state is None else state
        kept = self._composed
        if kept[0] is state:
            return kept[1]
        composed = self._compose_all(state)
        if state is self.store.state:
            self._composed = (state, composed)
        return composed

    def edited_model(self, state: EditState | None = None) -> Model:
        """The model as ``state`` (the current one by default) makes it."""
        files = tuple(c.model_file for c in self.composed_all(state).values())
        tensors = tuple(t for f in files for t in f.tensors)
        metadata = files[0].metadata if self.metadata_editable else self.model.metadata
        return Model(files, tensors, metadata, self.model.source)

    def checked(self, state: EditState) -> dict[str, ComposedFile]:
        """Refuse (EINVAL) a state the format cannot hold, before it is kept; else its
        composed files."""
        try:
            return self._compose_all(state)
        except (EditError, TextError) as error:
            raise EditRefused(errno.EINVAL, str(error)) from None

    def commit(self, state: EditState) -> Committed:
        """Check ``state``, keep it in the store, and make it the current one."""
        composed = self.checked(state)
        self.store.commit(state)
        self._composed = (state, composed)
        return Committed(state, composed)

    # -- the index of a sharded safetensors model --------------------------------------------
    def _read_index(self) -> dict | None:
        """A sharded safetensors model's index (its weight_map follows the removed and
        renamed tensors), or None."""
        if self.format != "safetensors" or len(self.files) < 2:
            return None
        for companion in self.model.companions:
            if not companion.name.endswith(".index.json"):
                continue
            source = companion.source()
            try:
                index = json.loads(source.read(0, source.size))
            except ValueError:
                return None
            if isinstance(index, dict) and isinstance(index.get("weight_map"), dict):
                return index
            return None
        return None

    def index_bytes(self, state: EditState) -> bytes:
        """The index as ``state`` makes it (``index`` is not None)."""
        assert self.index is not None
        index = dict(self.index)
        weight_map = {}
        for name, shard in index["weight_map"].items():
            edit = state.tensors.get(name)
            if edit is None:
                weight_map[name] = shard
            elif edit.name is not None:
                weight_map[edit.name] = shard
        index["weight_map"] = weight_map
        return (json.dumps(index, indent=2, ensure_ascii=False) + "\n").encode()

    # -- metadata ----------------------------------------------------------------------------
    @staticmethod
    def check_key_name(key: str, shown: str) -> None:
        """Refuse (EINVAL) a key no model holds: empty, or with a NUL (``shown``: the name
        the user gave)."""
        if not key or "\0" in key:
            raise EditRefused(errno.EINVAL, f"{shown!r}: a metadata key is a non-empty name "
                              "without NUL")

    def check_type(self, type_name: str) -> None:
        """Refuse (EINVAL) a type no key of this model may have."""
        if not valid_type(type_name, self.format):
            raise EditRefused(errno.EINVAL, f"{type_name!r}: not a metadata type here")

    @staticmethod
    def parsed(key: str, type_name: str, text: bytes, outcome: str) -> Typed:
        """``text`` (a metadata file's) read in ``type_name``; refused (EINVAL) saying
        ``outcome`` when it is not a value of that type."""
        try:
            return type_name, parse_text(type_name, text)
        except TextError as error:
            raise EditRefused(errno.EINVAL, f"metadata/{key}: {error} ({outcome})") from None

    def key_typed(self, key: str) -> Typed:
        """A key's (type, value) now."""
        typed = self.state.metadata.get(key)
        if typed is None:
            value = self.model_file.metadata[key]
            typed = (value.type_name, value.value())
        return typed

    def _without_key(self, state: EditState, key: str) -> EditState:
        return state.with_metadata(key, None) if key in self.model_file.metadata \
            else state.without_metadata(key)

    def set_key(self, key: str, typed: Typed) -> Committed:
        """A key set (made, if new) to ``typed``."""
        return self.commit(self.state.with_metadata(key, typed))

    def retype_key(self, key: str, type_name: str, text: bytes) -> Committed:
        """A key re-typed: its text now (``text``) read in ``type_name``."""
        self.check_type(type_name)
        try:
            value = parse_text(type_name, text)
        except TextError as error:
            raise EditRefused(errno.EINVAL, f"{key}: {error}") from None
        return self.set_key(key, (type_name, value))

    def delete_key(self, key: str) -> Committed:
        return self.commit(self._without_key(self.state, key))

    def move_key(self, key: str | None, new_key: str, typed: Typed | None) -> Committed | None:
        """``key`` (None: none) deleted and ``new_key`` set to ``typed`` (None: not set), in
        one edit; None when that changes nothing."""
        state = self.state if key is None else self._without_key(self.state, key)
        if typed is not None:
            state = state.with_metadata(new_key, typed)
        return None if state is self.state else self.commit(state)

    # -- tensors -----------------------------------------------------------------------------
    def tensor(self, original: str) -> TensorInfo:
        """The model's tensor of that (original) name."""
        return self.by_name[original]

    def current_name(self, original: str) -> str | None:
        """A tensor's name now (None: removed)."""
        edit = self.state.tensors.get(original)
        return original if edit is None else edit.name

    def current_names(self) -> set[str]:
        """Every tensor's name now."""
        names = (self.current_name(t.name) for t in self.model.tensors)
        return {name for name in names if name is not None}

    def _named_now(self, original: str) -> str:
        name = self.current_name(original)
        if name is None:
            raise EditRefused(errno.ENOENT, f"{original}: removed meanwhile")
        return name

    def _replace(self, original: str, name: str, data_name: str) -> tuple[Committed, str]:
        """The tensor's bytes now those of the store's file ``data_name``; if the edit is
        not kept (refused, the disk full), that file goes again: the store is as before."""
        try:
            return self.commit(self.state.with_tensor(original, TensorEdit(name, data_name))), \
                data_name
        except BaseException:
            self.store.drop_data(data_name)
            raise

    def replace_raw(self, original: str, pending: PendingData) -> tuple[Committed, str]:
        """A tensor's bytes replaced by those written in ``pending`` (exactly its size);
        the edit and the name of the kept bytes in the store."""
        t = self.by_name[original]
        if pending.size != t.nbytes:
            raise EditRefused(errno.EINVAL, f"{t.name}: {pending.size} bytes written, the "
                              f"tensor holds {t.nbytes} (it keeps its bytes)")
        name = self._named_now(original)
        data_name = pending.keep()
        try:
            committed = self.commit(self.state.with_tensor(original, TensorEdit(name, data_name)))
        except BaseException:
            self.store.forget_data(data_name)
            pending.unkeep()                # still the session's: a later close tries again
            raise
        pending.drop()
        return committed, data_name

    def replace_npy(self, original: str, npy: bytes) -> tuple[Committed, str]:
        """A tensor's bytes replaced by the array of a ``numpy.save`` file, stored in the
        tensor's type (of its shape); as ``replace_raw``."""
        from tensorfs.runtime.libraries import np

        t = self.by_name[original]
        try:
            array = np.load(io.BytesIO(npy), allow_pickle=False)
            data = encode_array(t, array)
        except EditError as error:
            raise EditRefused(errno.EINVAL, f"{t.name}: {error} (it keeps its bytes)") from None
        except (ValueError, OSError, EOFError) as error:
            raise EditRefused(errno.EINVAL, f"{t.name}: not a .npy file of an array: "
                              f"{error}") from None
        name = self._named_now(original)
        return self._replace(original, name, self.store.put_data(data))

    def remove_tensor(self, original: str) -> Committed:
        return self.commit(self.state.with_tensor(original, TensorEdit(None)))

    def renamed(self, mapping: dict[str, str]) -> EditState:
        """The state with tensors renamed (original name -> new name), checked (a name
        taken: EEXIST; a name the format refuses: EINVAL) but not kept: ``commit`` it."""
        current = self.current_names()
        state = self.state
        for original, new_name in mapping.items():
            if new_name in current:
                raise EditRefused(errno.EEXIST, f"tensor {new_name!r} exists already")
            edit = state.tensors.get(original)
            data = edit.data if edit is not None else None
            state = state.with_tensor(original, TensorEdit(new_name, data)
                                      if new_name != original or data else None)
        self.checked(state)
        return state
