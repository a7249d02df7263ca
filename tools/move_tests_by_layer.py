"""Move tests/test_*.py into one folder per layer of tensorfs/ (issue 36), with ``git mv``.

Run once by whoever merges, after every branch that adds tests is in:

    python tools/move_tests_by_layer.py          # says what it would move
    python tools/move_tests_by_layer.py --apply  # moves, then: pytest --collect-only -q tests

A test file not in ``PLACES`` is named and left where it is (place it, then run again).
``tests/remote/``, ``tests/clients/``, ``tests/regressions/`` and ``tests/support/`` stay as
they are.  The test folders hold no ``__init__.py`` (as tests/remote/ does not), so a file's
name stays unique across folders; the files that build paths from their own ``__file__``
are listed after a move, to be checked by hand (``Path(__file__).parents[1]`` is the
repository root from tests/, and parents[2] from a folder below it).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"

# folder -> the test files of that layer (tests/project/test_layers.py names the layers)
PLACES = {
    "project": ["test_layers", "test_docs", "test_support", "test_demo", "test_platforms",
                "test_typecheck"],
    "formats": ["test_gguf_parser", "test_safetensors_parser", "test_truncated", "test_fuzz",
                "test_pytorch", "test_pytorch_hostile", "test_pytorch_fuzz", "test_pytorch_large"],
    "convert": ["test_convert", "test_workers"],
    "editing": ["test_edits", "test_edits_owner", "test_edits_tools", "test_edits_views"],
    "sources": ["test_sources", "test_diskcache", "test_urls", "test_shard_names"],
    "views": ["test_views", "test_namespace"],
    "loading": ["test_shards", "test_files", "test_files_trust", "test_copies",
                "test_pytorch_files"],
    "api": ["test_api"],
    "facts": ["test_facts_diff", "test_facts_files", "test_facts_hash", "test_facts_numbers",
              "test_facts_stats", "test_facts_terminal"],
    "mount": ["test_mount_gguf", "test_mount_safetensors", "test_mount_converted",
              "test_metadata_files", "test_xattrs", "test_limits", "test_longwork"],
    "fuse": ["test_fuse3", "test_struct_layout", "test_libfuse_matrix", "test_mountoptions",
             "test_fd_mount", "test_mount_readiness", "test_concurrency", "test_faults"],
    "cli": ["test_cli", "test_inspect", "test_list", "test_messages", "test_daemon",
            "test_shutdown", "test_unmount_elsewhere"],
    "audit": ["test_audit_limits", "test_audit_names", "test_audit_numbers",
              "test_audit_outputs"],
}


def _rewrite_references(renames: dict[str, str]) -> None:
    """Every mention of a moved file (``tests/test_x.py``, also as ``tests/test_x.py::name``)
    in the docs, the README, the Makefile, the code and the tests, made its new path."""
    root = TESTS.parent
    pattern = re.compile("|".join(re.escape(old) + r"\b" for old in renames))
    files = [root / "README.md", root / "Makefile", root / "CHANGELOG.md",
             *root.glob("docs/*.md"), *root.glob("tensorfs/**/*.py"), *root.glob("tests/**/*.py"),
             *root.glob("bench/**/*.py"), *root.glob("tools/*")]
    for path in files:
        if not path.is_file() or path.name == "CHANGELOG.md":
            continue                # history says where a file was then
        text = path.read_text()
        new = pattern.sub(lambda m: renames[m.group(0)], text)
        if new != text:
            path.write_text(new)
            print(f"references updated: {path.relative_to(root)}")


def main(argv: list[str]) -> int:
    apply = "--apply" in argv
    placed = {name: folder for folder, names in PLACES.items() for name in names}
    moved, unplaced = [], []
    for path in sorted(TESTS.glob("test_*.py")):
        folder = placed.get(path.stem)
        if folder is None:
            unplaced.append(path.name)
            continue
        target = TESTS / folder / path.name
        print(f"{path.relative_to(TESTS.parent)} -> {target.relative_to(TESTS.parent)}")
        if apply:
            target.parent.mkdir(exist_ok=True)
            subprocess.run(["git", "mv", str(path), str(target)], check=True, cwd=TESTS.parent)
            moved.append(target)
    for name in unplaced:
        print(f"not placed (add it to PLACES): tests/{name}")
    if moved:
        _rewrite_references({f"tests/{t.name}": f"tests/{t.parent.name}/{t.name}" for t in moved})
    for target in moved:
        if re.search(r"__file__", target.read_text()):
            print(f"check its paths from __file__: {target.relative_to(TESTS.parent)}")
    return 1 if unplaced else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
