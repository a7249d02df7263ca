"""Each test file lives in a folder of tests/ (the layer of tensorfs/ it tests, or project/,
remote/, clients/ ...: docs/internals/development.md, "The map"), none at tests/ top level,
where pytest would still collect it but no reader of the map would look for it."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_test_file_at_the_top_of_tests():
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []


def test_every_test_folder_is_in_the_map():
    """A folder of test files is named in development.md's map, so a reader finds it."""
    text = (TESTS.parent / "docs" / "internals" / "development.md").read_text()
    folders = sorted({p.parent.relative_to(TESTS).parts[0] for p in TESTS.rglob("test_*.py")
                      if p.parent != TESTS})
    assert [f for f in folders if f"tests/{f}/" not in text] == []
