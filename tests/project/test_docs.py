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
GUIDES = sorted((ROOT / "docs" / "guide").glob("*.md"))


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
    README, docs/reference/cli.md or a guide say an option's default in a sentence."""
    wrong = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "reference" / "cli.md", *GUIDES):
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
    """Each option ``mount --help`` lists has its row in docs/reference/cli.md's table and a place in
    the mount usage lines of docs/reference/cli.md and the README (``--edits`` was missing from all
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


# -- the three shelves: every page reached from an index, every link and anchor whole --------

INDEX = ROOT / "docs" / "README.md"
GUIDE_WORDS, README_WORDS = 1500, 1200


def _links(text: str):
    """``(path, anchor)`` of each markdown link that is not a URL: path "" for ``#anchor``."""
    for match in re.finditer(r"\]\(([^)\s]+)\)", text):
        target = match.group(1)
        if not re.match(r"[a-z][a-z0-9+.-]*:", target):
            path, _, anchor = target.partition("#")
            yield path, anchor


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation dropped, spaces
    to hyphens, -1, -2 … for repeats), outside code blocks."""
    seen: dict[str, int] = {}
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.DOTALL | re.MULTILINE)
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        if n:
            seen.setdefault(f"{slug}-{n}", 1)        # the second "## Options" is options-1
    return set(seen)


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_anchor_a_link_names_is_a_heading_there(doc):
    broken = []
    for path, anchor in _links(doc.read_text()):
        target = (doc.parent / path) if path else doc
        if anchor and target.suffix == ".md" and target.exists() and anchor not in _anchors(target):
            broken.append(f"{path}#{anchor}")
    assert broken == [], f"{doc.relative_to(ROOT)} links to headings that are not there: {broken}"


def test_every_page_is_linked_from_the_docs_index():
    linked = {(INDEX.parent / path).resolve() for path, _ in _links(INDEX.read_text()) if path}
    pages = {p.resolve() for p in (ROOT / "docs").rglob("*.md")} - {INDEX.resolve()}
    assert sorted(str(p.relative_to(ROOT)) for p in pages - linked) == []


def test_the_readme_links_the_index_and_every_guide():
    linked = {(ROOT / path).resolve() for path, _ in _links((ROOT / "README.md").read_text())
              if path}
    wanted = {INDEX.resolve(), *(p.resolve() for p in (ROOT / "docs" / "guide").glob("*.md"))}
    assert sorted(str(p.relative_to(ROOT)) for p in wanted - linked) == []


def test_the_docs_are_on_three_shelves():
    """docs/ holds the index and three folders: guide/ (a page per task), reference/,
    internals/; a page added at the top is a page no shelf holds."""
    top = sorted(p.name for p in (ROOT / "docs").iterdir() if p.suffix == ".md")
    assert top == ["README.md"]
    assert sorted(p.name for p in (ROOT / "docs").iterdir() if p.is_dir()) == \
        ["guide", "internals", "reference"]


@pytest.mark.parametrize("page", [*GUIDES, ROOT / "README.md"],
                         ids=[str(p.relative_to(ROOT)) for p in [*GUIDES, ROOT / "README.md"]])
def test_a_guide_and_the_readme_stay_within_their_word_budget(page):
    words = len(page.read_text().split())
    budget = README_WORDS if page.name == "README.md" else GUIDE_WORDS
    assert words <= budget, f"{page.relative_to(ROOT)} is {words} words (at most {budget})"


@pytest.mark.parametrize("page", [*GUIDES, ROOT / "README.md"],
                         ids=[str(p.relative_to(ROOT)) for p in [*GUIDES, ROOT / "README.md"]])
def test_a_guide_tells_no_history(page):
    """Issue numbers are the project's history (CHANGELOG.md, internals), not a user's task."""
    found = re.findall(r"\bissues? \d+", page.read_text(), flags=re.IGNORECASE)
    assert found == [], f"{page.relative_to(ROOT)} mentions {found}"


# -- the command line reference against --help ------------------------------------------------

def _help_options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions if action.help != argparse.SUPPRESS
            for flag in action.option_strings if flag.startswith("--") or len(flag) == 2} - {"-h", "--help"}


def _sections(text: str) -> dict[str, str]:
    """The text under each ``## …`` heading of cli.md, and of each ``### Options of A, B``
    table, by each command the heading names."""
    out: dict[str, str] = {}
    for section in re.split(r"^##+ ", text, flags=re.MULTILINE)[1:]:
        heading = section.splitlines()[0]
        named = re.match(r"Options of ([\w, ]+)", heading)
        if named:
            names = [c.strip() for c in named.group(1).split(",")]
        elif re.match(r"[a-z, ]+$", heading):
            names = re.findall(r"[a-z]+", heading)
        else:
            continue
        for name in names:
            out[name] = out.get(name, "") + section
    return out


ALIASES = {"umount": "unmount"}


def test_the_cli_reference_names_every_command_and_option_help_prints():
    """``tensorfs --help`` lists the commands, ``tensorfs CMD --help`` each one's options: each
    command has its section in docs/reference/cli.md, naming every option of it."""
    text = (ROOT / "docs" / "reference" / "cli.md").read_text()
    sections = _sections(text)
    top = build_parser()
    missing = [flag for flag in _help_options(top) if flag not in text]
    for name, parser in _commands().items():
        if name in ALIASES:                             # named in its command's section
            missing += [] if re.search(rf"\b{name}\b", sections.get(ALIASES[name], "")) else [name]
            continue
        body = sections.get(name)
        if body is None:
            missing.append(f"## {name}")
            continue
        missing += [f"{name} {flag}" for flag in sorted(_help_options(parser))
                    if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", body)]
    assert missing == []


def test_the_cli_reference_test_sees_an_option_left_out():
    text = (ROOT / "docs" / "reference" / "cli.md").read_text()
    body = _sections(text)["unmount"]
    assert "--lazy" in body
    assert "--lazy" not in _sections(text.replace("--lazy", "--la zy"))["unmount"]


def test_every_docs_page_the_code_names_exists():
    """The code's messages, help and comments point at pages (``docs/reference/cli.md``): a
    page moved leaves none of them pointing at nothing."""
    others = {"docs/gguf.md"}                     # ggml's own, named in formats/gguf.py
    named: dict[str, str] = {}
    files = [*(ROOT / "tensorfs").rglob("*.py"), *(ROOT / "tests").rglob("*.py"),
             *(ROOT / "bench").rglob("*.py"),
             *(ROOT / "tools").glob("*"), *(ROOT / "examples").glob("*"), ROOT / "Makefile"]
    for path in files:
        if path.is_file():
            for page in re.findall(r"(?<![\w/.-])docs/[\w/.-]+\.(?:md|png)", path.read_text()):
                named.setdefault(page, str(path.relative_to(ROOT)))
    missing = sorted(f"{page} ({where})" for page, where in named.items()
                     if page not in others and not (ROOT / page).exists())
    assert missing == []


# every line the commands raise for a mount point, an option or the machine is documented
MESSAGE_ERRORS = {"UserError", "DaemonError", "OptionError", "RuntimeDirError", "FuseUnavailable"}
MESSAGE_PAGES = [ROOT / "docs" / "guide" / "troubleshooting.md",
                 ROOT / "docs" / "reference" / "messages.md"]


def _raised_messages():
    """(where, the longest literal part) of each message raised with one of MESSAGE_ERRORS
    in tensorfs/: the text between its {placeholders}."""
    import ast

    for path in sorted((ROOT / "tensorfs").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                    and isinstance(node.exc.func, ast.Name) and node.exc.func.id in MESSAGE_ERRORS
                    and node.exc.args):
                continue
            parts: list[str] = []

            def literal(n) -> None:
                if isinstance(n, ast.Constant) and isinstance(n.value, str):
                    parts.append(n.value)
                elif isinstance(n, ast.JoinedStr):
                    for v in n.values:
                        literal(v) if isinstance(v, ast.Constant) else parts.append("\0")
                elif isinstance(n, ast.BinOp):
                    literal(n.left)
                    literal(n.right)
                else:
                    parts.append("\0")

            literal(node.exc.args[0])
            pieces = [p.strip(" :(") for p in "".join(parts).split("\0")]
            pieces = [p for p in pieces if len(p) >= 10]
            if pieces:
                yield f"{path.relative_to(ROOT)}:{node.lineno}", max(pieces, key=len)


def test_every_message_the_commands_raise_is_documented():
    text = " ".join(" ".join(p.read_text().split()) for p in MESSAGE_PAGES)
    found = list(_raised_messages())
    assert len(found) > 30
    missing = [f"{where}: {piece[:60]!r}" for where, piece in found if piece[:40] not in text]
    assert missing == []
