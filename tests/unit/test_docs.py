"""The documents hold together: README.md stays short, every relative link in README.md,
BENCHMARKS.md and docs/*.md reaches a file (and, with an anchor, a heading in it), and
README.md links every page under docs/. CHANGELOG.md is history and is not checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_MAX_LINES = 300
DOCS = sorted((ROOT / "docs").glob("*.md"))
CHECKED = [README, ROOT / "BENCHMARKS.md", *DOCS]

FENCE = re.compile(r"^ {0,3}(```|~~~)")
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t]*#*[ \t]*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def prose_lines(text: str) -> list[str]:
    """``text``'s lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (code spans and links as their text),
    lowercased, punctuation dropped but for hyphens and underscores, spaces as hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor ``path``'s headings make (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    """The targets of ``path``'s Markdown links that are not URLs, outside code."""
    links = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        links += [m.group(1) for m in LINK.finditer(INLINE_CODE.sub("", line))]
    return [link for link in links if not SCHEME.match(link)]


def test_slug_follows_github():
    assert slug("What `scripts/serve.sh` leaves out") == "what-scriptsservesh-leaves-out"
    assert slug("Set up (fresh machine, Python 3.11+)") == "set-up-fresh-machine-python-311"
    assert slug("The local hop: the CPU pool's replica called over a socket") == (
        "the-local-hop-the-cpu-pools-replica-called-over-a-socket")
    assert slug("OpenAI-compatible: `POST /v1/embeddings`, `GET /v1/models`") == (
        "openai-compatible-post-v1embeddings-get-v1models")


def test_readme_is_short():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move long explanations "
        "to a page under docs/ and link it")


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_a_file_and_a_heading(path):
    broken = []
    for link in relative_links(path):
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.exists():
            broken.append(f"{link}: no file {file.relative_to(ROOT)}")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file)):
            broken.append(f"{link}: no heading in {file.relative_to(ROOT)} makes #{anchor}")
    assert not broken, f"{path.relative_to(ROOT)} has broken links: " + "; ".join(broken)


def test_readme_links_every_page_under_docs():
    linked = {(ROOT / link.partition("#")[0]).resolve() for link in relative_links(README)}
    missing = [str(page.relative_to(ROOT)) for page in DOCS if page.resolve() not in linked]
    assert not missing, f"README.md does not link {missing} (add them to its Documents list)"


BLITZ_IMPORT = re.compile(r"from (blitz(?:\.\w+)*) import ([\w, ]+)")


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: p.name)
def test_blitz_names_in_examples_exist(path):
    """Every ``from blitz... import ...`` in a document's code (the snippets users paste)
    names a module and attributes that exist: a renamed module breaks the test, not the
    reader's first try."""
    import importlib

    missing = []
    for module_name, names in BLITZ_IMPORT.findall(path.read_text(encoding="utf-8")):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing.append(module_name)
            continue
        for name in (n.split(" as ")[0].strip() for n in names.split(",")):
            if name and not hasattr(module, name):
                try:
                    importlib.import_module(f"{module_name}.{name}")
                except ImportError:
                    missing.append(f"{module_name}.{name}")
    assert not missing, f"{path.name} imports names that do not exist: {missing}"
