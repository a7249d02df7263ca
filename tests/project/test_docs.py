"""The user docs tell the truth about the repository and the code: every relative link leads
to a file of the repository, and every default the docs state for an option is argparse's."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from tensorfs.cli.parser import build_parser, parse_size

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _targets(text: str):
    """Relative link targets: markdown links ``[x](path#anchor)``, and bare paths of
    markdown files (``notes/x.md``) that a reader would look for."""
    for match in re.finditer(r"\]\(([^)\s]+)\)", text):
        target = match.group(1)
        if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#"):
            yield target.split("#")[0]
    for match in re.finditer(r"(?<![\w/.:-])((?:[\w.-]+/)+[\w.-]+\.md)\b", text):
        yield match.group(1)


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_relative_link_resolves_to_a_file_of_the_repository(doc):
    broken = sorted({t for t in _targets(doc.read_text()) if t and not
                     ((doc.parent / t).exists() or (ROOT / t).exists())})
    assert broken == [], f"{doc.relative_to(ROOT)} names files that do not exist: {broken}"


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _option(command: str, flag: str) -> argparse.Action:
    parser = _commands()[command]
    for action in parser._actions:
        if flag in action.option_strings:
            return action
    raise AssertionError(f"docs name {command} {flag}, which the parser does not have")


def _same(stated: str, default) -> bool:
    if isinstance(default, bool) or default is None or default == []:
        return False                       # a value is stated where the code has none
    if isinstance(default, tuple):
        return stated == ",".join(default)
    if isinstance(default, float):
        return float(stated) == default
    if isinstance(default, int):
        return parse_size(stated) == default
    return stated == str(default)


def _option_tables(text: str):
    """Rows ``(command, flag, default cell)`` of the docs' option tables: a heading
    ``### Options of COMMAND`` (or ``... of A, B``) followed by a table whose columns are
    ``| option | default | … |``.  The default cell is ``default: `VALUE` `` where the code
    has a value, or words (``off``, ``none``, ``automatic …``) where it has none."""
    for section in re.split(r"^### ", text, flags=re.MULTILINE)[1:]:
        heading = section.splitlines()[0]
        match = re.match(r"Options of ([\w, ]+)", heading)
        if not match:
            continue
        commands = [c.strip() for c in match.group(1).split(",") if c.strip()]
        for line in section.splitlines():
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            if len(cells) < 2 or not cells[0].startswith("`-"):
                continue
            flag = re.match(r"`(-[\w-]+)", cells[0]).group(1)
            for command in commands:
                yield command, flag, cells[1]


def test_every_default_in_the_option_tables_is_the_parsers():
    text = (ROOT / "docs" / "reference" / "cli.md").read_text()
    rows = list(_option_tables(text))
    assert {c for c, _, _ in rows} >= {"mount", "inspect", "list", "unmount"}
    wrong = []
    for command, flag, cell in rows:
        default = _option(command, flag).default
        stated = re.fullmatch(r"default: `([^`]*)`", cell)
        if stated:
            if not _same(stated.group(1), default):
                wrong.append(f"{command} {flag}: docs say {stated.group(1)!r}, code {default!r}")
        elif not (default in (None, False, []) or default == argparse.SUPPRESS):
            wrong.append(f"{command} {flag}: docs state no value ({cell!r}), code {default!r}")
    assert wrong == []


def test_every_default_said_in_prose_is_the_parsers():
    """``--views`` (default raw,npy,files), "`--cache-size` (default 256M)": wherever the
    README or docs/cli.md say an option's default in a sentence."""
    wrong = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "reference" / "cli.md"):
        for match in re.finditer(r"`(--[\w-]+)[^`]*`\s*\(default:?\s*`?([\w.,]+)`?\)", doc.read_text()):
            flag, stated = match.groups()
            default = _option("mount", flag).default
            if not _same(stated, default):
                wrong.append(f"{doc.name}: {flag}: {stated!r} is not {default!r}")
    assert wrong == []


def test_the_synopses_name_each_option_as_the_parser_does():
    """``[--views raw,npy,files]`` in a synopsis is the parser's metavar (or its choices):
    a synopsis that lists fewer views reads as the default."""
    wrong = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "reference" / "cli.md"):
        for line in doc.read_text().splitlines():
            command = re.search(r"tensorfs (mount|unmount|inspect|list|hash|stats|diff) ", line)
            if not command:
                continue
            for flag, shown in re.findall(r"\[(--[\w-]+) ([^\]\s]+)\]", line):
                action = _option(command.group(1), flag)
                expected = "|".join(action.choices) if action.choices else action.metavar
                if shown != expected:
                    wrong.append(f"{doc.name}: {flag} {shown} (the parser: {expected})")
    assert wrong == []


def test_every_mount_option_is_in_the_table_and_the_usage_lines():
    """Each option ``mount --help`` lists has its row in docs/cli.md's table and a place in
    the mount usage lines of docs/cli.md and the README (``--edits`` was missing from all
    three)."""
    mount = _commands()["mount"]
    flags = {a.option_strings[0] for a in mount._actions
             if a.option_strings and a.help != argparse.SUPPRESS} - {"-h"}
    flags |= {"--debug"}
    in_table = {flag for command, flag, _ in _option_tables((ROOT / "docs" / "reference" / "cli.md").read_text())
                if command == "mount"}
    assert sorted(flags - in_table) == []
    for doc in (ROOT / "README.md", ROOT / "docs" / "reference" / "cli.md"):
        lines = doc.read_text().splitlines()
        first = next(i for i, line in enumerate(lines)
                     if re.match(r"`?tensorfs mount MODEL MOUNTPOINT ", line))
        usage = lines[first]                    # and its continuation lines, indented
        for line in lines[first + 1:]:
            if not re.match(r"`? {8}", line):
                break
            usage += line
        assert sorted(f for f in flags if f not in usage) == [], doc.name


def test_mount_help_says_read_only_only_without_edits():
    description = _commands()["mount"].description
    assert "read-only" not in description or "--edits" in description


PAGES = DOCS


@pytest.mark.parametrize("doc", PAGES, ids=[str(d.relative_to(ROOT)) for d in PAGES])
def test_every_source_file_a_page_names_exists(doc):
    """A test a page cites as its evidence (``tests/x/test_y.py``), a module or a benchmark
    it points to (``tensorfs/x/y.py``, ``bench/z.py``) is there: a file moved or renamed
    leaves no page pointing at nothing."""
    named = set(re.findall(r"(?<![\w/.-])(?:tests|tensorfs|bench|tools)/[\w/]+\.py",
                           doc.read_text()))
    missing = sorted(n for n in named if not (ROOT / n).exists())
    assert missing == [], f"{doc.relative_to(ROOT)} names files that do not exist: {missing}"


@pytest.mark.parametrize("doc", PAGES, ids=[str(d.relative_to(ROOT)) for d in PAGES])
def test_every_page_is_one_a_person_reads(doc):
    """No page of the docs over 400 lines: a longer topic gets a page of its own."""
    lines = len(doc.read_text().splitlines())
    assert lines <= 400, f"{doc.relative_to(ROOT)} is {lines} lines"
