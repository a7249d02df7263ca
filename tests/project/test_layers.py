"""The layers of tensorfs, checked on the import graph: every module of the package is read
(its syntax tree: nothing is imported), each of its imports of another tensorfs module is an
edge, those inside functions included.  The graph has no cycle, and a module imports only
modules of its own layer or of a layer below.

``LAYERS`` declares the order; ``MODULE_LAYERS`` places each module by its dotted name's
longest matching prefix, so that a folder (``tensorfs.sources.transports``) is placed whole.  A new
module is placed here before it is used."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "tensorfs"

# Lowest first: a layer may use every layer before it, never one after it.  Each folder of
# tensorfs/ is one layer.
LAYERS = [
    "runtime",      # runtime/: the machine: runtime files, the mount table, private paths
    "core",         # tensorfs/*.py: errors, the model's description, types, status, caches
    "fuse",         # fuse/: the libfuse binding (ABI, loader, session, Operations, -o): core only
    "formats",      # formats/: the parsers, bytes in, a ModelFile out
    "convert",      # convert/: stored types to float32, each tensor's view plan, the workers
    "sources",      # sources/: where the bytes live: local files, URLs, transports, caches
    "editing",      # editing/: the edit session in model terms (state, commit, compose), the
    #                 store in DIR (a replacement's bytes are a ``Source``); no tree
    "views",        # views/: byte views of a source, and the naming rule that places them
    "hfgguf",       # hfgguf/: a Hugging Face directory as the GGUF llama.cpp's converter writes
    "loading",      # loading/: a model loaded: its shards, its files whole
    "api",          # api.py: the Python API
    "facts",        # facts/: hash, stats, diff
    "mount",        # mount/: what a mount serves (tree, metadata, edits), its adapter, the daemon
    "cli",          # cli/: the command line
]

MODULE_LAYERS = {
    "tensorfs": "core",
    "tensorfs.runtime": "runtime",
    "tensorfs.formats": "formats",
    "tensorfs.convert": "convert",
    "tensorfs.editing": "editing",
    "tensorfs.sources": "sources",
    "tensorfs.views": "views",
    "tensorfs.hfgguf": "hfgguf",
    "tensorfs.loading": "loading",
    "tensorfs.api": "api",
    "tensorfs.facts": "facts",
    "tensorfs.fuse": "fuse",
    "tensorfs.mount": "mount",
    "tensorfs.cli": "cli",
    "tensorfs.__main__": "cli",
}


def modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package) for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the tensorfs modules it imports (``from tensorfs import x`` names the
    module ``tensorfs.x`` when there is one, else the package)."""
    known = modules()

    def owner(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, (path, is_package) in known.items():
        package = name if is_package else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(owner(a.name) for a in node.names if a.name.split(".")[0] == "tensorfs")
            elif isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = (f"{base}.{node.module}" if node.module else base) if node.level \
                    else node.module or ""
                if target.split(".")[0] != "tensorfs":
                    continue
                edges.update(owner(f"{target}.{a.name}") if f"{target}.{a.name}" in known
                             else owner(target) for a in node.names)
        edges.discard(name)
        edges.discard(None)
        graph[name] = edges
    return graph


def layer_of(module: str) -> str | None:
    """The layer of the longest prefix of ``module`` that ``MODULE_LAYERS`` places."""
    name = module
    while name:
        if name in MODULE_LAYERS:
            return MODULE_LAYERS[name]
        name = name.rpartition(".")[0]
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles a depth-first walk finds (each once, as the path that closes it)."""
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for child in sorted(graph.get(node, ())):
            if state.get(child) == "open":
                found.append(path[path.index(child):] + [child])
            elif child not in state:
                visit(child, path + [child])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_every_module_has_a_declared_layer():
    unplaced = sorted(m for m in modules() if layer_of(m) is None)
    assert not unplaced, f"place these in MODULE_LAYERS (tests/project/test_layers.py): {unplaced}"
    assert set(MODULE_LAYERS.values()) <= set(LAYERS)


def test_the_import_graph_has_no_cycle():
    assert cycles(import_graph()) == []


def test_no_module_imports_a_layer_above_its_own():
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    upward = sorted(f"{m} ({layer_of(m)}) imports {d} ({layer_of(d)})"
                    for m, imported in import_graph().items() for d in imported
                    if layer_of(m) and layer_of(d) and rank[layer_of(d)] > rank[layer_of(m)])
    assert upward == [], "\n".join(upward)


@pytest.mark.parametrize("module, expected", [("tensorfs.sources.transports.hub", "sources"),
                                              ("tensorfs.convert.ggml", "convert"),
                                              ("tensorfs.mount.adapter", "mount"),
                                              ("tensorfs.fuse.session", "fuse")])
def test_a_module_is_placed_by_its_longest_prefix(module, expected):
    assert layer_of(module) == expected


def test_the_checks_see_a_cycle_and_an_upward_import():
    """The checks themselves: a graph with a cycle, and the real graph with an import of
    the mount layer added to the lowest source module, and one of the tree added to the
    binding."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    graph = import_graph()
    assert graph["tensorfs.mount.adapter"] >= {"tensorfs.fuse.session", "tensorfs.views.names"}
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    graph["tensorfs.sources.local"].add("tensorfs.mount.adapter")
    assert any(rank[layer_of(d)] > rank[layer_of(m)] for m, imported in graph.items()
               for d in imported)
    graph = import_graph()
    graph["tensorfs.fuse.session"].add("tensorfs.views.names")
    assert any(rank[layer_of(d)] > rank[layer_of(m)] for m, imported in graph.items()
               for d in imported)


def test_every_folder_is_a_layer():
    """The layers are folders: each package of tensorfs/ is placed whole, by its own name,
    and no module sits at the top but the core's and the API's."""
    folders = sorted(f"tensorfs.{p.name}" for p in PACKAGE.iterdir()
                     if p.is_dir() and (p / "__init__.py").exists())
    assert folders and all(f in MODULE_LAYERS for f in folders), folders
    top = sorted(m for m in modules() if m.count(".") == 1 and m not in MODULE_LAYERS
                 and f"{m}" not in folders)
    assert all(layer_of(m) == "core" for m in top), top


def test_editing_knows_nothing_of_the_tree():
    """The edit session (``editing/``) works in model terms: it imports nothing of the
    views, the loading or the mount, and names none of the tree's types; the mount's
    tree-side editor calls down into it, and the handles call back through a declared
    ``HandleOwner``, not an import of the editor."""
    graph = import_graph()
    editing = {m for m in graph if m.startswith("tensorfs.editing")}
    assert "tensorfs.editing.session" in editing
    above = sorted(f"{m} imports {d}" for m in editing for d in graph[m]
                   if d.startswith(("tensorfs.views", "tensorfs.loading", "tensorfs.mount")))
    assert above == [], above
    for m in editing:
        path = modules()[m][0]
        names = {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
        assert not names & {"FileNode", "DirNode", "Tree", "View"}, m
    assert "tensorfs.editing.session" in graph["tensorfs.mount.editable"]
    assert "tensorfs.mount.editable" not in graph["tensorfs.mount.edithandles"]
    assert "tensorfs.mount.edithandles" in graph["tensorfs.mount.editable"]


def test_a_handle_calls_back_only_what_handle_owner_declares():
    """The one call-back of an edit's route: a handle calls its ``owner`` (the editor that
    made it) only through the methods ``edithandles.HandleOwner`` declares."""
    tree = ast.parse(modules()["tensorfs.mount.edithandles"][0].read_text())
    owner = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "HandleOwner")
    declared = {n.name for n in owner.body if isinstance(n, ast.FunctionDef)}
    called = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
              and (isinstance(n.value, ast.Name) and n.value.id == "owner"
                   or isinstance(n.value, ast.Attribute) and n.value.attr == "owner")}
    assert called and called <= declared, called - declared
