"""The ``metadata/`` directory (docs/reference/shards-and-metadata.md): one file per metadata key, made on first use.

The user's version of these rules is docs/reference/shards-and-metadata.md.

* **File name**: the whole key, escaped like one tensor-name component (``%``, ``/``, control
  characters and undecodable bytes as ``%XX``; the empty key is ``%``; over 200 bytes it is
  shortened with a hash) but dots are kept: ``metadata/tokenizer.ggml.tokens``.  The keys
  ``.`` and ``..`` have their dots written ``%2E``.  Flat: the directory has no subdirectories.
* **Scalars**: the value's text plus one ``\\n``.  A string is written verbatim (its bytes
  as stored, a multi-line chat template stays multi-line): the value is the file minus its
  last byte.  Integers in decimal; floats as the shortest text that round-trips in their
  stored width (``repr`` of the value ``metadata.json`` holds; ``nan``, ``inf``, ``-inf``);
  booleans ``true`` / ``false``; JSON null ``null``; a JSON object (index metadata) as one
  line of JSON.
* **Arrays**: one element per line, every line ending in ``\\n`` (``wc -l`` is the element
  count, an empty array is an empty file, line N is element N - 1).  A string element is
  escaped so that it stays one line: ``\\`` -> ``\\\\``, newline -> ``\\n``, CR -> ``\\r``,
  tab -> ``\\t``, other control characters (U+0000-U+001F, U+007F) -> ``\\xNN``, and a byte
  that is not UTF-8 (a vocabulary may hold such) -> ``\\xNN`` of that byte; everything else
  is the UTF-8 text itself.  ``codecs.escape_decode(line)[0]`` gives the element's bytes
  back.  Numbers and booleans as for scalars; an element that is itself an array (GGUF
  nested arrays) or an object is one line of JSON.

The text of a value both ways (shown, and read back from an edit) is
``tensorfs.formats.metadata_text``'s; this module places it in the tree.

Scalars are ``GeneratedView``s.  Arrays are ``ArrayTextView``s: a ``GeneratedView`` whose
text is made in chunks of ``CHUNK_ELEMENTS`` elements from one decode of the array, kept in
the shared LRU in blocks; the first stat renders the text once to learn its length, and a
sequential read costs one more decode and render whatever ``--cache-size`` is (the view's
cursor continues where the last block ended, see ``tensorfs.views.byteviews.GeneratedView``).
"""

from __future__ import annotations

from collections.abc import Hashable

from tensorfs.cache import ByteLRU
from tensorfs.formats.metadata_text import is_array, render_lines, scalar_text
from tensorfs.model import MetadataValue, Model
from tensorfs.views.byteviews import GeneratedView
from tensorfs.views.names import Tree, entry_name

DIRECTORY = "metadata"
CHUNK_ELEMENTS = 4096


def metadata_file_name(key: str) -> str:
    """The file name of ``key`` inside ``metadata/``."""
    return entry_name(key)


# -- views --------------------------------------------------------------------------------

class ArrayTextView(GeneratedView):
    """An array's text, one element per line, rendered ``CHUNK_ELEMENTS`` elements at a
    time: a ``GeneratedView`` whose producer decodes the array once and yields its lines
    chunk by chunk, so the whole text never exists as one object and reading it costs one
    decode whatever the cache holds."""

    def __init__(self, cache: ByteLRU, key: Hashable, value: MetadataValue):
        super().__init__(cache, key, lambda: self._pieces())
        self.value = value

    def _pieces(self):
        items = self.value.value()
        for start in range(0, len(items), CHUNK_ELEMENTS):
            yield render_lines(items[start:start + CHUNK_ELEMENTS], self.value.type_name)


def metadata_view(cache: ByteLRU, key: str, value: MetadataValue, version: int = 0):
    """``version``: which edit of the key this is (an edited mount), so that the text of an
    earlier value kept in the cache is never served for a later one."""
    cache_key = (DIRECTORY, key) if not version else (DIRECTORY, key, version)
    if is_array(value):
        return ArrayTextView(cache, cache_key, value)
    return GeneratedView(cache, cache_key, lambda: scalar_text(value.value()))


def add_metadata_files(tree: Tree, model: Model, cache: ByteLRU) -> None:
    """``metadata/`` with one file per key of ``model.metadata`` (the directory always exists)."""
    tree.add_dir(DIRECTORY)
    for key, value in model.metadata.items():
        tree.add_file(f"{DIRECTORY}/{metadata_file_name(key)}", metadata_view(cache, key, value))
