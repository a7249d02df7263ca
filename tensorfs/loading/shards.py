"""What the user named -> the files of one model: a single file, a Hugging Face safetensors
index, a split GGUF, or a directory holding exactly one of those (docs/reference/shards-and-metadata.md).

Every shard is parsed and validated by ``tensorfs.sources.modelfile.parse_source``, like a single
file; this module only checks that the shards make one model.  Every way a set of shards is
refused is a ``ShardError`` whose ``kind`` is a key of ``KINDS``; the CLI prints it as one
``tensorfs: error: FILE: …`` line.  The user's version is docs/reference/shards-and-metadata.md.

What is accepted, and the choices where the formats' own tools are silent:

* **An index** is told from its bytes (a JSON object, not a model file), not its name
  (``pytorch_model.bin.index.json`` too: its shards must then all be PyTorch checkpoints).  It
  is the Hugging Face layout ``{"metadata": {...}, "weight_map": {tensor: shard-file}}``;
  ``metadata`` may be absent or null.  Shards are the distinct ``weight_map`` values in
  sorted order (what ``transformers`` does); ``Model.tensors`` is each shard's tensors in
  file order, shard after shard.  A shard name must be a plain file name in the index's
  directory ("sub/x", "../x", "/abs/x" are refused: nothing outside that directory is ever
  opened through an index).  A symlink is followed only to a file inside the directory,
  or from a Hugging Face cache snapshot into its own ``../../blobs``
  (``tensorfs.sources.local.contained_problem``).  A tensor the index names must be in the shard
  it names; a tensor a shard holds but the index does not list is served anyway (the
  Hugging Face loaders read whole shard files too); the same name in two shards is refused.
  ``total_size`` is not checked (writers disagree on what it counts).
  ``Model.metadata`` is the index's ``metadata`` with JSON type names ("string", "integer",
  "number", "boolean", "null", "array", "object"); each shard's own ``__metadata__`` stays
  in its ``headers/SHARD.bin``.
* **A split GGUF** is what gguf-py's ``GGUFWriter(split_max_tensors=…)`` and llama.cpp's
  ``gguf-split`` write: ``PREFIX-00001-of-0000N.gguf`` … with ``split.no`` (0-based),
  ``split.count`` and ``split.tensors.count``.  As in llama.cpp, the first shard is the one
  to give (another is refused, naming the first) and the others' names are made from its
  prefix.  ``Model.metadata`` is the first shard's KV pairs, ``split.*`` included (they are
  real keys of that file); the others hold only ``split.*`` keys and are checked, not
  merged.  A file whose ``split.count`` is absent, 0 or 1 is an ordinary single file.
* **A directory**: its non-hidden regular files (symlinks as above, subdirectories not
  searched) are sorted into candidates: each ``*.safetensors.index.json``, each GGUF split
  set (one candidate, its first shard, even if that one is missing), and each other
  ``*.safetensors`` / ``*.gguf`` that is not a shard of an index or of a split set
  (``*-NNNNN-of-MMMMM.safetensors`` counts as a shard).  Exactly one candidate is loaded;
  zero or several are refused (the message lists them).  A directory holding one plain
  model file mounts that file as if it had been given (``header.bin``, not ``headers/``).
* **A safetensors shard given directly** is just one file.
"""

from __future__ import annotations

import json
import os
import re
from itertools import chain
from operator import itemgetter
from typing import Iterable

from tensorfs.errors import ModelError, ShardError
from tensorfs.formats import gguf, safetensors
from tensorfs.formats.safetensors import _lone_surrogate
from tensorfs.model import MetadataValue, Model, ModelFile, TensorInfo
from tensorfs.sources.location import DIRECTORY, FILE, LocalLocation, Location, name_problem

# ---------------------------------------------------------------------------------------
# Every way a set of shards is refused.  ``ShardError.kind`` is always one of these keys.
# ---------------------------------------------------------------------------------------
KINDS: dict[str, str] = {
    "no_model":         "a directory with no model file, index or split set in it",
    "several_models":   "a directory with more than one candidate model",
    "index_json":       "an index that is not UTF-8 JSON, has a duplicate key, or is not "
                        "{\"weight_map\": {tensor: file}, \"metadata\": {...} | null}",
    "empty_index":      "an index whose weight_map names no tensor",
    "shard_path":       "an index (or a split GGUF's first shard) naming a shard that is not a "
                        "plain file name in its directory: empty, . or .., a / or \\, a "
                        "percent-escape, a control character (location.name_problem)",
    "too_many_shards":  "an index or split GGUF naming more than MAX_SHARDS shards",
    "missing_shard":    "a shard file (named by an index, or by a split GGUF's count) that does not exist",
    "shard_kind":       "a shard name that names a directory or another non-regular file",
    "shard_format":     "a shard in another format than its set (a GGUF named by an index ...)",
    "index_tensor":     "an index naming a tensor that its shard does not hold",
    "duplicate_tensor": "the same tensor name in two shards",
    "split_key":        "split.no / split.count / split.tensors.count missing where needed, not an "
                        "integer, or out of range (split.count above 99999, negative counts)",
    "split_name":       "a first split GGUF whose file name is not PREFIX-00001-of-NNNNN.gguf for its split.count",
    "not_first":        "a split GGUF shard other than the first was given",
    "split_count":      "a shard whose split.count differs from the first shard's",
    "split_no":         "a shard whose split.no is not its place in the set (out of order, "
                        "duplicated), or outside 0 to split.count - 1",
    "tensor_count":     "split.tensors.count differs from the number of tensors the shards hold",
}

# The largest index read: the biggest real ones are ~10 MB (a 100k-tensor weight_map).  The
# size is checked with fstat before anything is read, so a huge (or sparse) file costs
# nothing; decoding an index costs a few times its size in Python objects.
MAX_INDEX_BYTES = 64 << 20
SPLIT_GGUF_NAME = re.compile(r"(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf", re.S)
SHARD_SAFETENSORS_NAME = re.compile(r".+-\d{5}-of-\d{5}\.safetensors", re.S)
INDEX_SUFFIX = ".safetensors.index.json"
MODEL_SUFFIXES = (".safetensors", ".gguf")
PYTORCH_INDEX_SUFFIX = ".bin.index.json"
PYTORCH_SUFFIXES = (".bin", ".pt", ".pth")
SHARD_PYTORCH_NAME = re.compile(r".+-\d{5}-of-\d{5}\.bin", re.S)
# What transformers' Trainer saves beside a model: torch.save files, not models
TRAINER_FILES = frozenset({"training_args.bin", "optimizer.pt", "scheduler.pt", "scaler.pt"})
LISTED_CANDIDATES = 5           # how many names a "several models" error lists
# The most shards one model may have.  The largest real sets have a few hundred (DeepSeek-V3:
# 163, Llama-3.1-405B: 191); each shard costs an open file (a descriptor, or a connection's
# share) and its parsed header for the life of the mount, so a hostile index naming a
# hundred thousand small files is refused before any of them is opened.
MAX_SHARDS = 4096


def _error(kind: str, message: str, file: str, *, name: str | None = None,
           offset: int | None = None) -> ShardError:
    assert kind in KINDS, kind
    return ShardError(kind, message, offset=offset, name=name, file=file)


def _quote(text: str) -> str:
    """A name inside a message: repr-style, so control characters stay visible on one line."""
    return repr(text) if not text.isprintable() or "'" in text else f"'{text}'"


# ---------------------------------------------------------------------------------------
# What the user named
# ---------------------------------------------------------------------------------------

def load(path: str, loc: Location | None = None) -> Model:
    """The model a mount of ``path`` serves (a file, an index, a first shard, a directory),
    its files opened through ``loc`` (``tensorfs.sources.location``; local when not given)."""
    loc = loc or LocalLocation()
    if loc.isdir(path):
        return _load_directory(path, loc)
    return _load_file(path, path, loc)


def _load_file(path: str, source: str, loc: Location) -> Model:
    if _looks_like_index(path, loc):
        return _load_index(path, source, loc)
    first = loc.parse(path)
    if first.format == "gguf":
        split = _split_keys(first)
        if split is not None:
            return _load_split_gguf(first, split, source, loc)
    return Model((first,), first.tensors, first.metadata, source)


def _looks_like_index(path: str, loc: Location) -> bool:
    """A JSON object rather than a model file: told from the first bytes, as models are.
    The file is opened once, here: the parser reads the same source."""
    source = loc.open(path)         # refuses what is not a regular file, before reading
    try:
        size = source.size
        prefix = source.read(0, min(size, 4096))
    except OSError:
        return False                 # the parser says why, in its words
    if gguf.looks_like_gguf(prefix) or safetensors.looks_like_safetensors(prefix, size):
        return False
    return prefix.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")[:1] == b"{"


# ---------------------------------------------------------------------------------------
# Directories
# ---------------------------------------------------------------------------------------

def _load_directory(directory: str, loc: Location) -> Model:
    candidates = directory_candidates(directory, loc)
    if not candidates:
        odd = [n for n in loc.files(directory)
               if n.endswith(MODEL_SUFFIXES + (INDEX_SUFFIX,)) and name_problem(n) is not None]
        left_out = (f" ({len(odd)} left out, whose name is not a plain file name: "
                    f"{_quote(odd[0])} is {name_problem(odd[0])})") if odd else ""
        raise _error("no_model", "directory holds no *.safetensors.index.json, *.safetensors, "
                     f"*.gguf or PyTorch checkpoint{left_out}", directory)
    if len(candidates) > 1:
        shown = ", ".join(candidates[:LISTED_CANDIDATES])
        more = f" and {len(candidates) - LISTED_CANDIDATES} more" if len(candidates) > LISTED_CANDIDATES else ""
        raise _error("several_models", f"directory holds {len(candidates)} models ({shown}{more}): "
                     f"name one of them instead", directory)
    path = _sibling(loc, directory, candidates[0], directory)
    if loc.kind(path) is None:      # a split set whose first shard is missing
        raise _error("missing_shard", f"first shard {_quote(candidates[0])} of a split GGUF "
                     f"is missing", directory)
    model = _load_file(path, path, loc)
    if len(model.files) > 1 or model.source != model.files[0].path:
        # A set of shards: the mount is named after what the user gave.
        return Model(model.files, model.tensors, model.metadata, directory)
    return model                     # one plain file: as if it had been given


def directory_candidates(directory: str, loc: Location | None = None) -> list[str]:
    """File names in ``directory`` that could each be given as the model, sorted."""
    loc = loc or LocalLocation()
    names = loc.listed(directory)
    covered: set[str] = set()
    indexes = [n for n in names if n.endswith(INDEX_SUFFIX)]
    for index in indexes:
        covered.update(_index_shard_names_quietly(loc.sibling(directory, index), loc))
    split_firsts = set()
    for name in names:
        match = SPLIT_GGUF_NAME.fullmatch(name)
        if match:
            covered.add(name)
            split_firsts.add(f"{match['prefix']}-00001-of-{match['count']}.gguf")
    plain = [n for n in names
             if n.endswith(MODEL_SUFFIXES) and n not in covered and n not in indexes
             and not SHARD_SAFETENSORS_NAME.fullmatch(n)]
    found = sorted(set(indexes) | split_firsts | set(plain))
    if found:
        return found
    # No safetensors or GGUF model: a PyTorch checkpoint (a repository that has both is
    # mounted from its safetensors files, as transformers loads it)
    indexes = [n for n in names if n.endswith(PYTORCH_INDEX_SUFFIX)]
    for index in indexes:
        covered.update(_index_shard_names_quietly(loc.sibling(directory, index), loc))
    return sorted(set(indexes) | {
        n for n in names if n.endswith(PYTORCH_SUFFIXES) and n not in covered
        and n not in TRAINER_FILES and not n.startswith("rng_state")
        and not SHARD_PYTORCH_NAME.fullmatch(n)})


def _index_shard_names_quietly(path: str, loc: Location) -> Iterable[str]:
    """The shard names an index lists, or nothing if it is unreadable (it is reported when
    loaded, if it is the one candidate)."""
    try:
        doc = json.loads(loc.read_all(path, MAX_INDEX_BYTES))
        return [v for v in doc["weight_map"].values() if isinstance(v, str)]
    except Exception:
        return []


# ---------------------------------------------------------------------------------------
# Hugging Face safetensors index
# ---------------------------------------------------------------------------------------

class _Duplicate(Exception):
    pass


def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


_UNDECIDED = object()


def _decoded_if_unique(text: str):
    """The JSON ``text`` decoded by the plain (hook-free, faster) decoder if it provably has
    no duplicate key, else ``_UNDECIDED``.

    The plain decoder keeps the last of two equal keys; whether it dropped one is told by
    counting (``tensorfs.formats.safetensors._keys_unique`` says why a count of ``:`` is
    enough).  Undecided when the count cannot tell, the text is not JSON, or it nests
    deeply (near the recursion limit the hook's own frame makes the hook-based decoder give
    up a level or two earlier): then the caller decodes with the hook, as before, so every
    outcome is the hook-based decoder's.
    """
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return _UNDECIDED
    return doc if text.count(":") == _object_keys(doc) else _UNDECIDED


_SCALARS = frozenset((str, int, float, bool, type(None)))
_SHALLOW = 100                  # levels of nesting; the recursion limit is about 1000


def _object_keys(value) -> int:
    """How many keys the JSON objects in ``value`` hold, nested ones included; -1 if it
    nests deeper than ``_SHALLOW`` levels."""
    keys, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if type(item) is dict:
            keys += len(item)
            item = item.values()
        elif type(item) is not list:
            continue
        if level > _SHALLOW:
            return -1
        if not _SCALARS.issuperset(map(type, item)):    # a weight_map's strings: at C speed
            stack.extend((child, level + 1) for child in item if type(child) in (dict, list))
    return keys


def _read_index(path: str, loc: Location | None = None) -> tuple[dict, dict[str, str]]:
    """(metadata, weight_map) of an index, validated."""
    own = loc is None
    loc = loc or LocalLocation()
    try:
        raw = loc.read_all(path, MAX_INDEX_BYTES)
    except OSError as error:
        raise ModelError("unreadable", f"cannot read: {error.strerror}", file=path) from None
    finally:
        if own:
            loc.close_all()
    if raw is None:
        raise _error("index_json", f"index is more than the {MAX_INDEX_BYTES} bytes an index "
                     "may have (its size is checked before anything is read)", path)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _error("index_json", "index is not valid UTF-8", path, offset=exc.start) from None
    bom = 3 if raw.startswith(b"\xef\xbb\xbf") else 0
    lone = _lone_surrogate(text)
    if lone is not None:
        # Python's json would accept it, and the string could then be written nowhere as
        # UTF-8 (metadata.json, metadata/ names, a terminal): refused, as safetensors
        # headers are (serde_json refuses it).
        raise _error("index_json", "index is not valid JSON: lone UTF-16 surrogate in a \\u "
                     "escape", path, offset=bom + len(text[:lone].encode("utf-8")))
    try:
        doc = _decoded_if_unique(text)
        if doc is _UNDECIDED:
            doc = json.loads(text, object_pairs_hook=_no_duplicates)
    except _Duplicate as dup:
        raise _error("index_json", f"index has the key {_quote(dup.args[0])} twice", path,
                     name=dup.args[0]) from None
    except json.JSONDecodeError as exc:
        at = bom + len(text[:exc.pos].encode("utf-8", "surrogatepass"))
        raise _error("index_json", f"index is not valid JSON: {exc.msg}", path, offset=at) from None
    except RecursionError:
        raise _error("index_json", "index JSON nests too deep", path) from None
    except ValueError as exc:       # an integer of more digits than Python converts
        raise _error("index_json", f"index is not JSON tensorfs reads: {str(exc)[:80]}",
                     path) from None
    if not isinstance(doc, dict):
        raise _error("index_json", f"index must be a JSON object, not {_json_type(doc)}", path)
    if "weight_map" not in doc:       # config.json, tokenizer.json ... beside the model
        raise _error("index_json", "not a safetensors index (a JSON object without "
                     "\"weight_map\"): give the model file, its *.safetensors.index.json or "
                     "its directory", path)
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict):
        raise _error("index_json", f"index \"weight_map\" must be an object of tensor -> shard "
                     f"file, but it is a JSON {_json_type(weight_map)}", path)
    if not {str}.issuperset(map(type, weight_map.values())):    # all str: at C speed
        tensor, shard = next((t, s) for t, s in weight_map.items() if not isinstance(s, str))
        raise _error("index_json", f"index \"weight_map\" gives tensor {_quote(tensor)} a "
                     f"{_json_type(shard)} instead of a shard file name", path, name=tensor)
    metadata = doc.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise _error("index_json", f"index \"metadata\" must be an object or null, not "
                     f"{_json_type(metadata)}", path)
    return metadata, weight_map


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def json_metadata_value(value) -> MetadataValue:
    """An index ``metadata`` value, kept as JSON gave it; arrays count their elements."""
    kind = _json_type(value)
    return MetadataValue(kind, lambda: value, len(value) if kind == "array" else None)


def _sibling(loc: Location, directory: str, name: str, file: str, *,
             tensor: str | None = None) -> str:
    """The path of shard ``name`` beside ``file``, or the one ``shard_path`` line saying why
    the name is refused (``location.name_problem``: the one rule for every transport)."""
    try:
        return loc.sibling(directory, name)
    except ValueError as why:
        named = f" (for tensor {_quote(tensor)})" if tensor is not None else ""
        raise _error("shard_path", f"shard {_quote(name)}{named} is {why}: a shard must be a "
                     "plain file name in the same directory", file, name=tensor) from None


def _check_shard_count(count: int, file: str) -> None:
    if count > MAX_SHARDS:
        raise _error("too_many_shards", f"{count} shards: at most {MAX_SHARDS} are mounted "
                     "(docs/reference/shards-and-metadata.md)", file)


def _load_index(path: str, source: str, loc: Location) -> Model:
    metadata, weight_map = _read_index(path, loc)
    if not weight_map:
        raise _error("empty_index", "index \"weight_map\" names no tensor", path)
    shard_names = sorted(set(weight_map.values()))
    _check_shard_count(len(shard_names), path)
    directory = loc.dirname(path)
    shard_paths = []
    for name in shard_names:
        if name_problem(name) is not None:
            tensor = next(t for t, s in weight_map.items() if s == name)
            shard_paths.append(_sibling(loc, directory, name, path, tensor=tensor))
        else:
            shard_paths.append(loc.sibling(directory, name))
    files = _present_and_parsed(shard_names, shard_paths, path, "named by the index", loc)
    # all safetensors, or all PyTorch checkpoints (pytorch_model.bin.index.json)
    expected = "pytorch" if files[0].format == "pytorch" else "safetensors"
    for shard_path, model_file in zip(shard_paths, files):
        if model_file.format != expected:
            raise _error("shard_format", f"shard {_quote(loc.basename(shard_path))} is "
                         f"{model_file.format}, not {expected}", path)
    if not _shards_match_index(weight_map, shard_names, files):
        owner = _owners(files, path)
        by_name = dict(zip(shard_names, shard_paths))
        for tensor, shard in weight_map.items():
            holder = owner.get(tensor)
            if holder != by_name[shard]:
                where = f"; it is in {_quote(os.path.basename(holder))}" if holder else ""
                raise _error("index_tensor", f"index puts tensor {_quote(tensor)} in "
                             f"{_quote(shard)}, which does not hold it{where}", path,
                             name=tensor)
    tensors = tuple(chain.from_iterable(f.tensors for f in files))
    return Model(tuple(files), tensors,
                 {key: json_metadata_value(value) for key, value in metadata.items()}, source)


def _present_and_parsed(names: list[str], paths: list[str], file: str, named_by: str,
                        loc: Location) -> list[ModelFile]:
    """Each shard parsed; a missing one, then one that is not a regular file, then the
    first that was refused (in the order of ``paths``) is the error."""
    loaded = loc.each(loc.kind_and_parse, paths)
    _check_present(names, [kind for kind, _ in loaded], file, named_by)
    for _, parsed in loaded:
        if isinstance(parsed, Exception):
            raise parsed
    return [parsed for _, parsed in loaded]


def _check_present(names: list[str], kinds: list[str | None], file: str,
                   named_by: str) -> None:
    missing = [n for n, k in zip(names, kinds) if k is None]
    if missing:
        also = f" ({len(missing)} of {len(names)} shards missing)" if len(missing) > 1 else ""
        raise _error("missing_shard", f"shard {_quote(missing[0])} {named_by} is missing{also}",
                     file)
    for name, kind in zip(names, kinds):
        if kind != FILE:
            what = "a directory" if kind == DIRECTORY else "not a regular file"
            raise _error("shard_kind", f"shard {_quote(name)} {named_by} is {what}", file)


def _owners(files: list[ModelFile], file: str) -> dict[str, str]:
    """tensor name -> path of the shard holding it; a name in two shards is refused."""
    owner: dict[str, str] = {}
    for model_file in files:
        for tensor in model_file.tensors:
            before = owner.setdefault(tensor.name, model_file.path)
            if before != model_file.path:
                raise _error("duplicate_tensor", f"tensor {_quote(tensor.name)} is in two shards: "
                             f"{_quote(os.path.basename(before))} and "
                             f"{_quote(os.path.basename(model_file.path))}", file, name=tensor.name)
    return owner


_tensor_name = itemgetter(0)            # TensorInfo.name, at C speed


def _shards_match_index(weight_map: dict[str, str], shard_names: list[str],
                        files: list[ModelFile]) -> bool:
    """True if the shards hold exactly the index's tensors, each in the shard the index
    names: the common case, told without building a tensor -> shard map.

    Each tensor a shard holds is listed by the index for that shard, and the shards hold as
    many tensors as the index lists.  A name is never twice in one safetensors file (its
    header is a JSON object), and a name in two shards cannot be listed for both; so the
    held names are distinct, all in the index and as many: exactly its tensors.  False
    leaves it to ``_owners`` and the index walk to say what is wrong, if anything (a shard
    may hold tensors the index does not list).
    """
    if sum(len(f.tensors) for f in files) != len(weight_map):
        return False
    listed_shard = weight_map.get
    return all({name}.issuperset(map(listed_shard, map(_tensor_name, f.tensors)))
               for name, f in zip(shard_names, files))


# ---------------------------------------------------------------------------------------
# Split GGUF
# ---------------------------------------------------------------------------------------

SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
MAX_SPLIT_COUNT = 99999         # shard names number them in five digits (PREFIX-00001-of-NNNNN)


def _int_key(model_file: ModelFile, key: str) -> int | None:
    value = model_file.metadata.get(key)
    if value is None:
        return None
    number = value.value() if value.count is None else None
    if not isinstance(number, int) or isinstance(number, bool):
        raise _error("split_key", f"{key} must be an integer, not {value.type_name}",
                     model_file.path, name=key)
    return number


def _split_keys(model_file: ModelFile) -> tuple[int, int, int | None] | None:
    """(split.no, split.count, split.tensors.count) of a shard of a split set, or None."""
    count = _int_key(model_file, SPLIT_COUNT)
    if count is not None and not 0 <= count <= MAX_SPLIT_COUNT:
        raise _error("split_key", f"split.count is {count}: a split GGUF has 2 to "
                     f"{MAX_SPLIT_COUNT} shards (0 or 1: not split)", model_file.path,
                     name=SPLIT_COUNT)
    if count is None or count <= 1:
        return None
    number = _int_key(model_file, SPLIT_NO)
    if number is None:
        raise _error("split_key", f"split.count is {count} but split.no is missing",
                     model_file.path, name=SPLIT_NO)
    if not 0 <= number < count:
        raise _error("split_no", f"split.no is {number}, outside 0 to {count - 1} for "
                     f"split.count {count}", model_file.path, name=SPLIT_NO)
    tensors = _int_key(model_file, SPLIT_TENSORS)
    if tensors is not None and tensors < 0:
        raise _error("split_key", f"split.tensors.count is {tensors}, a negative number of "
                     "tensors", model_file.path, name=SPLIT_TENSORS)
    return number, count, tensors


def split_shard_name(prefix: str, number: int, count: int) -> str:
    """llama.cpp's ``llama_split_path``: ``PREFIX-%05d-of-%05d.gguf``, ``number`` 1-based."""
    return f"{prefix}-{number:05d}-of-{count:05d}.gguf"


def _load_split_gguf(first: ModelFile, split: tuple[int, int, int | None], source: str,
                     loc: Location) -> Model:
    number, count, tensors_count = split
    given = first.path
    base = loc.basename(given)
    match = SPLIT_GGUF_NAME.fullmatch(base)
    if number != 0:
        hint = (f": mount the first one, {_quote(split_shard_name(match['prefix'], 1, count))}"
                if match else ": mount the first one (split.no 0)")
        raise _error("not_first", f"this is shard {number + 1} of {count} of a split GGUF (split.no "
                     f"{number}){hint}", given)
    if not match or base != split_shard_name(match["prefix"], 1, count):
        raise _error("split_name", f"split GGUF with split.count {count} must be named "
                     f"PREFIX-00001-of-{count:05d}.gguf to find its other shards", given)
    _check_shard_count(count, given)
    directory = loc.dirname(given)
    names = [split_shard_name(match["prefix"], i, count) for i in range(1, count + 1)]
    paths = [given] + [_sibling(loc, directory, n, given) for n in names[1:]]
    files = [first]
    parsed = _present_and_parsed(names[1:], paths[1:], given,
                                 f"(one of the {count} that split.count names)", loc)
    for i, shard in enumerate(parsed, start=1):
        if shard.format != "gguf":
            raise _error("shard_format", f"shard {_quote(names[i])} is {shard.format}, not GGUF", given)
        keys = _split_keys(shard)
        if keys is None or keys[1] != count:
            theirs = _int_key(shard, SPLIT_COUNT)
            theirs = "missing" if theirs is None else theirs
            raise _error("split_count", f"shard {_quote(names[i])} has split.count {theirs}, the "
                         f"first shard {count}", given, name=SPLIT_COUNT)
        if keys[0] != i:
            raise _error("split_no", f"shard {_quote(names[i])} has split.no {keys[0]}, expected "
                         f"{i}", given, name=SPLIT_NO)
        if tensors_count is not None and keys[2] is not None and keys[2] != tensors_count:
            raise _error("tensor_count", f"shard {_quote(names[i])} has split.tensors.count "
                         f"{keys[2]}, the first shard {tensors_count}", given, name=SPLIT_TENSORS)
        files.append(shard)
    _owners(files, given)
    tensors: tuple[TensorInfo, ...] = tuple(t for f in files for t in f.tensors)
    if tensors_count is not None and tensors_count != len(tensors):
        raise _error("tensor_count", f"split.tensors.count is {tensors_count} but the {count} "
                     f"shards hold {len(tensors)} tensors", given, name=SPLIT_TENSORS)
    return Model(tuple(files), tensors, first.metadata, source)
