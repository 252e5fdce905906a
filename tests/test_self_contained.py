"""The repository cites only its own documents.

Every file git knows (tracked, or new and not ignored) is read: none may point outside the
repository, to the sibling `shared` folder or to the specification files the project was
written from. Every `docs/<page>.md` that src/, tests/, bench/, examples/, scripts/, docs/ or
the README cite must exist, and so must the section a citation names, in either form used here:
`docs/server.md, "Shutdown"` (the heading's text) or `docs/reference/errors.md#grpc-status-codes`
(its anchor).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Spelled in pieces, so that this file does not match its own patterns.
_OUTSIDE = re.escape("..") + r"[/\\]" + "shared"
_SPEC_NAMES = ("SERVER", "ENGINE", "CLIENT", "DESIGN", "COMPAT", "SCALE", "STYLE", "RUST")
_DOT_MD = r"\.md"
FORBIDDEN = [
    (re.compile(_OUTSIDE), "refers outside the repository"),
    (
        re.compile(r"\b(?:" + "|".join(_SPEC_NAMES) + r"|wire)" + _DOT_MD + r"\b"),
        "cites a spec file",
    ),
    # Looser forms: a spec name and a section number without the file extension, with or
    # without the word "section" or a section sign; "spec" or "specification" and a section.
    (
        re.compile(r"\b(?:" + "|".join(_SPEC_NAMES) + r")\s+(?:§\s*|sections?\s+)?\d"),
        "cites a section of a spec file",
    ),
    (
        re.compile(r"\bspec(?:ification)?\s+(?:section|§)", re.IGNORECASE),
        "cites a section of a spec file",
    ),
]

CITING = ("src/", "tests/", "bench/", "examples/", "scripts/", "docs/", "README.md")
CITATION = re.compile(r"(?<![\w./-])(docs/[\w./-]+?\.md)(?:#([\w-]+)|,[\s#*/]*\"([^\"\n]+)\")?")


def _files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    return sorted({p for p in out.decode().split("\0") if p})


def _text(rel: str) -> str | None:
    """A file's text, or None for a binary file or one deleted from the working tree."""
    try:
        data = (ROOT / rel).read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if b"\0" in data:
        return None
    return data.decode("utf-8", errors="replace")


def _slug(title: str) -> str:
    """The anchor a Markdown renderer (GitHub's rule) gives a heading."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


@cache
def _headings(rel: str) -> frozenset[str]:
    """A page's section titles (backticks dropped) and their anchors."""
    titles: set[str] = set()
    fenced = False
    for line in (ROOT / rel).read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.+?)\s*#*\s*$", line)):
            title = m.group(1).replace("`", "")
            titles.add(title)
            titles.add("#" + _slug(m.group(1)))
    return frozenset(titles)


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def test_no_file_refers_outside_the_repository() -> None:
    problems = []
    for rel in _files():
        text = _text(rel)
        if text is None:
            continue
        for pattern, why in FORBIDDEN:
            for m in pattern.finditer(text):
                problems.append(f"{rel}:{_line(text, m.start())}: {why}: {m.group(0)!r}")
    assert not problems, "\n".join(problems)


def test_cited_docs_pages_and_sections_exist() -> None:
    problems = []
    for rel in _files():
        if not rel.startswith(CITING):
            continue
        text = _text(rel)
        if text is None:
            continue
        for m in CITATION.finditer(text):
            page, anchor, section = m.groups()
            where = f"{rel}:{_line(text, m.start())}"
            if not (ROOT / page).is_file():
                problems.append(f"{where}: {page} does not exist")
            elif anchor is not None and "#" + anchor not in _headings(page):
                problems.append(f"{where}: {page} has no section #{anchor}")
            elif section is not None and section.replace("`", "") not in _headings(page):
                problems.append(f'{where}: {page} has no section "{section}"')
    assert not problems, "\n".join(problems)
