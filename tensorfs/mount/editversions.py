"""The versions an editable mount serves of what an edit changes as a whole (``--edits DIR``,
docs/reference/editing.md): a model file of files/ composed for one state of the edits
(``ComposedView``), metadata.json (``GeneratedVersion``), a sharded model's index
(``IndexView``) and a Hugging Face directory's GGUF files as the converter writes them from
the edited model (``GgufVersion``, docs/reference/hf-gguf.md).  Each is one version: an edit
makes a new node with a new one (``tensorfs.mount.editbase.EditorBase._new_versions``), so
that an open reads one version whole."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tensorfs.hfgguf.served import GgufSource
from tensorfs.editing.compose import ComposedFile
from tensorfs.editing.session import EditSession
from tensorfs.editing.store import EditState
from tensorfs.views.base import View
from tensorfs.views.byteviews import GeneratedView


class ComposedView(View):
    """A model file in files/ of an editable mount, one version of it: the file composed
    for one ``EditState`` (composed when first read, unless given).  Its bytes never change:
    an edit makes a new node (``Editor._new_versions``), so an open reads one version."""

    cheap_size = True
    mtime_ns: int | None

    def __init__(self, session: EditSession, path: str, state: EditState, mtime_ns: int,
                 composed: ComposedFile | None = None):
        self.session = session
        self.path = path
        self.state = state
        self._file = composed
        self.mtime_ns = mtime_ns

    def file(self) -> ComposedFile:
        found = self._file
        if found is None:
            with self.session.lock:
                found = self._file = self.session.composed(self.path, self.state)
        return found

    @property
    def size(self) -> int:
        return self.file().size

    def snapshot(self) -> View:
        return self

    def read_into(self, offset: int, buf) -> int:
        return self.file().read_into(offset, buf)

    def read_or_wait(self, offset: int, buf) -> int | Future[int]:
        """A remote model's kept tensors' bytes without a thread (``ComposedFile``)."""
        return self.file().read_or_wait(offset, buf)

    def read(self, offset: int, size: int) -> bytes:
        return self.file().read(offset, size)


class GeneratedVersion(GeneratedView):
    """metadata.json of an editable mount, one version of it (``Editor._new_versions``): a
    reader that opened it reads that version (its handle holds the view), not the next
    edit's bytes from the middle of the file on."""

    def snapshot(self) -> View:
        return self


class IndexView(View):
    """A sharded safetensors model's index in files/, its weight_map as edited: one version,
    as ``ComposedView``."""

    cheap_size = True
    mtime_ns: int | None

    def __init__(self, session: EditSession, state: EditState, mtime_ns: int):
        self.session = session
        self.state = state
        self._data: bytes | None = None
        self.mtime_ns = mtime_ns

    def _bytes(self) -> bytes:
        data = self._data
        if data is None:
            data = self._data = self.session.index_bytes(self.state)
        return data

    @property
    def size(self) -> int:
        return len(self._bytes())

    def snapshot(self) -> View:
        return self

    def read(self, offset: int, size: int) -> bytes:
        return self._bytes()[offset:offset + size]


class GgufVersion(View):
    """One of the converter's GGUF files in files/ of an editable mount, one version of it:
    composed from the model files as one ``EditState`` makes them (when first read), its
    tensors' bytes the edited ones, permuted or quantized as the converter would.  The same
    size as the GGUF of the directory on disk: only tensors' bytes change (a state that
    renames or removes a tensor offers no GGUF: ``Editor._new_gguf_versions``)."""

    cheap_size = True
    mtime_ns: int | None

    def __init__(self, session: EditSession, gguf: GgufSource, state: EditState, mtime_ns: int,
                 composed: dict[str, ComposedFile] | None = None):
        self.session = session
        self.gguf = gguf
        self.state = state
        self._files = composed
        self._source: GgufSource | None = None
        self.mtime_ns = mtime_ns

    def source(self) -> GgufSource:
        found = self._source
        if found is None:
            with self.session.lock:
                found = self._source
                if found is None:
                    files = self._files
                    if files is None:
                        files = self.session.composed_all(self.state)
                    from tensorfs.hfgguf.served import recompose

                    found = self._source = recompose(self.gguf, files)
                    self._files = None
        return found

    @property
    def size(self) -> int:
        return self.gguf.size

    def snapshot(self) -> View:
        return self

    def read_into(self, offset: int, buf) -> int:
        if offset >= self.size or len(buf) == 0:
            return 0
        return self.source().read_into(offset, memoryview(buf)[:self.size - offset])

    def read_or_wait(self, offset: int, buf) -> int | Future[int]:
        if offset >= self.size or len(buf) == 0:
            return 0
        return self.source().read_or_wait(offset, memoryview(buf)[:self.size - offset])

    def read(self, offset: int, size: int) -> bytes:
        out = bytearray(max(0, min(size, self.size - offset)))
        n = self.read_into(offset, memoryview(out)) if out else 0
        return bytes(out[:n])
