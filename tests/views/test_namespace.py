"""The escaping rule: every tensor reachable exactly once, every path inside the mount."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorfs.views.names import RESERVED_TOP_LEVEL, DirNode, Tree, tensor_paths

name_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
dotted = st.lists(st.sampled_from(["a", "b", "", "metadata", "headers", "npy", "raw", "%",
                                   "/", "..", "\n", "\x00", "é", "header", "bin"]),
                  min_size=1, max_size=5).map(".".join)
names_strategy = st.lists(st.one_of(name_text, dotted, st.text(min_size=250, max_size=400)),
                          unique=True, max_size=30)


def _decode(escaped: str) -> str:
    """%XX is a byte, a lone % an empty component; what the rule documents."""
    out = bytearray()
    for token in re.findall(r"%[0-9A-F]{2}|%|.", escaped, flags=re.S):
        if token == "%":
            continue
        out += bytes([int(token[1:], 16)]) if token.startswith("%") else token.encode()
    return out.decode("utf-8", "surrogateescape")


def _check(names, layout):
    paths = tensor_paths(names, layout)
    assert set(paths) == set(names)
    files = []
    for name, (raw, npy) in paths.items():
        files += [raw, npy]
    assert len(set(files)) == len(files), "two files share a path"
    tree = Tree()
    for path in files:
        parts = path.split("/")
        for part in parts:
            assert part not in ("", ".", ".."), path
            assert "\x00" not in part and len(part.encode()) <= 255, path
        if layout == "flat":
            assert len(parts) == 1
        tree.add_file(path, view=None)     # raises if a file and a directory collide
    for reserved in RESERVED_TOP_LEVEL:
        assert reserved not in files and all(not f.startswith(reserved + "/") for f in files)
    for name, (path, _) in paths.items():      # the path says which tensor it is
        if "%~" in path:
            continue
        if layout == "tree":
            parts = path.removesuffix(".raw").split("/")
            decoded = ".".join(_decode(p) for p in parts)
        else:
            decoded = _decode(path)
        assert decoded == name


def _walk(tree: Tree, order=lambda items: items) -> dict[str, tuple]:
    """path -> (view, inode) of every file, walking directories in the given order."""
    found = {}
    stack = [("", tree.root)]
    while stack:
        prefix, directory = stack.pop()
        for name, child in order(list(directory.children.items())):
            path = f"{prefix}{name}"
            if isinstance(child, DirNode):
                stack.append((path + "/", child))
            else:
                found[path] = (child.view, child.ino)
    return found


def _lazy_tree(names, layout):
    tree = Tree()
    tree.add_file("metadata.json", "generated")
    tree.add_tensors(names, layout, lambda i: (("raw", i), ("npy", i) if i % 3 else None, None))
    return tree


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(names_strategy, st.sampled_from(["tree", "flat"]), st.randoms(use_true_random=False))
def test_lazy_tree_places_files_where_tensor_paths_says(names, layout, rng):
    """The tree a mount serves, made directory by directory, against the eager rule: the
    same files at the same paths, and inode numbers that do not depend on the walk."""
    expected = {"metadata.json": "generated"}
    for i, name in enumerate(names):
        raw, npy = tensor_paths(names, layout)[name]
        expected[raw] = ("raw", i)
        if i % 3:
            expected[npy] = ("npy", i)
    walked = _walk(_lazy_tree(names, layout))
    assert {path: view for path, (view, _) in walked.items()} == expected

    def shuffled(items):
        rng.shuffle(items)
        return items
    other_walk = _walk(_lazy_tree(names, layout), shuffled)
    assert {p: ino for p, (_, ino) in other_walk.items()} == {p: ino for p, (_, ino) in walked.items()}
    inodes = [ino for _, ino in walked.values()]
    assert len(set(inodes)) == len(inodes)


def test_lazy_tree_expands_a_directory_only_when_asked():
    made = []
    tree = Tree()
    tree.add_tensors(["a.x", "a.y", "b.z"], "tree", lambda i: made.append(i) or ("raw", None, None))
    assert made == []
    assert tree.lookup("/b/z").view == "raw"
    assert made == [2]
    directory_inodes = {tree.lookup("/a").ino, tree.lookup("/b").ino}
    assert len(directory_inodes) == 2 and tree.node(tree.lookup("/a").ino) is tree.lookup("/a")


@settings(max_examples=300, deadline=None)
@given(names_strategy)
def test_tree_layout_reaches_every_tensor_once(names):
    _check(names, "tree")


@settings(max_examples=300, deadline=None)
@given(names_strategy)
def test_flat_layout_reaches_every_tensor_once(names):
    _check(names, "flat")


def test_examples():
    paths = tensor_paths(["blk.0.attn_q.weight", "a.b", "a.b.c", "metadata.x", "", "x.npy",
                          "x", "p/q", ".hidden", "new\nline"])
    assert paths["blk.0.attn_q.weight"] == ("blk/0/attn_q/weight", "blk/0/attn_q/weight.npy")
    assert paths["a.b"] == ("a/b.raw", "a/b.npy")
    paths = {name: raw for name, (raw, _) in paths.items()}
    assert paths["a.b.c"] == "a/b/c"
    assert paths["metadata.x"] == "%6Detadata/x"
    assert paths[""] == "%.raw"          # "%" is also a directory: ".hidden"
    assert paths["x.npy"] == "x/npy"
    assert paths["p/q"] == "p%2Fq"
    assert paths[".hidden"] == "%/hidden"
    assert paths["new\nline"] == "new%0Aline"
    flat = {name: raw for name, (raw, _) in tensor_paths(["x", "x.npy", "metadata.json", "a.b"], "flat").items()}
    assert flat == {"x": "x", "x.npy": "x%2Enpy", "metadata.json": "%6Detadata.json", "a.b": "a.b"}
