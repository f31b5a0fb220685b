"""The documentation holds together: every relative link in README.md and docs/*.md opens a file of this repository
(and the heading it names), the README stays short enough to read on two screens."""

from __future__ import annotations

import pathlib
import re
import unicodedata

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# the pages this repository writes by hand (rules.md and capacity.md are generated from the code)
HAND_WRITTEN = [p for p in PAGES if p.name not in ("rules.md", "capacity.md")]
README_MAX_LINES = 150

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"(?<!!)\[(?:[^\]\n]|\][^(])*?\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """The text without code blocks and code spans, where brackets are code, not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text without markup, lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: pathlib.Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text())) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def broken(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """The links of ``path`` that do not open a file under ``root`` (or a heading of it)."""
    bad = []
    for target in links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if root not in dest.parents and dest != root:
            bad.append(f"{target}: outside the repository")
        elif not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(root)}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken(page) == []


def test_readme_fits_on_two_screens():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; the rest belongs in docs/"


def test_vllm_rules_sections_cited_in_the_code_exist():
    """Code and tests cite ``docs/vllm-rules.md §N`` (or ``§N.M``): the section must be there."""
    doc = (ROOT / "docs" / "vllm-rules.md").read_text()
    sections = set(re.findall(r"^##+ (\d+(?:\.\d+)?)[. ]", doc, flags=re.M))
    missing = []
    for path in [*(ROOT / "service").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")]:
        for cite in re.findall(r"docs/vllm-rules\.md((?:,? ?§\d+(?:\.\d+)?)+)", path.read_text(errors="replace")):
            for n in re.findall(r"§(\d+(?:\.\d+)?)", cite):
                if n not in sections:
                    missing.append(f"{path.relative_to(ROOT)}: §{n}")
    assert missing == []


def test_the_link_checker_catches_what_it_should(tmp_path):
    assert slug("4. Context length (`max_model_len`)") == "4-context-length-max_model_len"
    assert slug("1. Tensor / pipeline / data / expert parallel divisibility") == (
        "1-tensor--pipeline--data--expert-parallel-divisibility"
    )
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\n\n## Two words\n\n[ok](#two-words) [bad](#three) [gone](missing.md) [up](../x.md) "
        "`[code](not-a-link.md)` [web](https://example.com)\n\n```\n[fenced](nope.md)\n```\n"
    )
    assert broken(page, root=tmp_path) == [
        "#three: no heading #three in page.md",
        "missing.md: no such file",
        "../x.md: outside the repository",
    ]
