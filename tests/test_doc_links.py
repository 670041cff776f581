"""Every relative link in README.md and docs/*.md points to a file that exists, and every #anchor to a
heading of that file, by GitHub's slug rules: a moved or renamed page or heading fails `make test`."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # https:, mailto:, ...


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a heading or a link inside one is code, not markdown)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (github-slugger on the rendered text: lower case, punctuation
    dropped but ``-`` and ``_``, each space a ``-``)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a markdown file; a repeated one gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def link_targets(text: str) -> list[str]:
    """The targets of a markdown file's inline links and reference definitions, outside code."""
    targets = []
    for line in prose_lines(text):
        definition = REFERENCE_DEFINITION.match(line)
        if definition:
            targets.append(definition.group(1))
            continue
        targets += INLINE_LINK.findall(CODE_SPAN.sub("", line))
    return targets


def link_problems(root: Path) -> list[str]:
    """One line per relative link of README.md and docs/*.md whose file or heading does not exist."""
    problems = []
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    for page in pages:
        for target in link_targets(page.read_text(encoding="utf-8")):
            if not target or EXTERNAL.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (page.parent / file_part).resolve() if file_part else page
            where = f"{page.relative_to(root)}: link to {target}"
            if not linked.exists():
                problems.append(f"{where}: no file {file_part}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                problems.append(f"{where}: no heading #{anchor} in {linked.relative_to(root)}")
    return problems


def test_every_relative_link_of_the_readme_and_the_docs_resolves():
    assert link_problems(ROOT) == []


def test_the_check_finds_a_missing_file_a_missing_heading_and_nothing_in_code(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "# Title\n\nSee [a](docs/A.md#second-part), [gone](docs/GONE.md), [web](https://example.com/x.md)\n"
        "and [self](#title). `[code](docs/NOPE.md)`\n\n```\n[fenced](docs/NOPE.md)\n```\n\n[ref]: docs/A.md#nope\n")
    (tmp_path / "docs" / "A.md").write_text(
        "# A\n\n## Second part\n\n## Second part\n\n[back](../README.md#title) [dup](#second-part-1) "
        "[bad](#second-part-2)\n\n```\n# not a heading\n```\n[code heading](#not-a-heading)\n")
    assert link_problems(tmp_path) == [
        "README.md: link to docs/GONE.md: no file docs/GONE.md",
        "README.md: link to docs/A.md#nope: no heading #nope in docs/A.md",
        "docs/A.md: link to #second-part-2: no heading #second-part-2 in docs/A.md",
        "docs/A.md: link to #not-a-heading: no heading #not-a-heading in docs/A.md",
    ]


def test_slugs_follow_githubs_rules():
    assert [slug(h) for h in ["Export (`packtrain export`)", "[BUILD.md](BUILD.md), `train.chunked_loss` and *more*",
                              "Upgrading: `make lock`", "Checking a build's tokens", "Class 7: low: num_proc, Ctrl-C",
                              "The check of exactly the first 2,048 rows (2026-11-27, 08:20-09:10 UTC)",
                              "The fourth GPU session (2026-11-26 23:54 - 2026-11-27 00:08 UTC)"]] == [
        "export-packtrain-export", "buildmd-trainchunked_loss-and-more", "upgrading-make-lock", "checking-a-builds-tokens", "class-7-low-num_proc-ctrl-c",
        "the-check-of-exactly-the-first-2048-rows-2026-11-27-0820-0910-utc",
        "the-fourth-gpu-session-2026-11-26-2354---2026-11-27-0008-utc"]


def opening_line(text: str) -> str:
    """The first line of prose after a page's title."""
    lines = [line for line in prose_lines(text) if line.strip()]
    return lines[1] if len(lines) > 1 and lines[0].startswith("# ") else ""


def test_every_doc_page_opens_with_who_it_is_for():
    """STYLE.md, habit 13: a page opens with who it is for and what it answers ("For anyone who ...")."""
    assert [page.name for page in sorted((ROOT / "docs").glob("*.md"))
            if not opening_line(page.read_text(encoding="utf-8")).startswith("For ")] == []
    assert [opening_line(text) for text in ["# T\n\nFor anyone.\n", "# T\n\nThe build.\n", "no title\n"]] == [
        "For anyone.", "The build.", ""]
