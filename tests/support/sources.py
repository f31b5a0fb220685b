"""What in a text a user could not open: private notes, a docs file that does not exist, a section it lacks."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRIVATE = re.compile(r"GUIDE\.md|vllm-rules|\.\./shared|correction \d")
DOC_SECTION = re.compile(r"(docs/[a-z_-]+\.md) §(\d+)((?:, §\d+)*)")


def unresolved(text: str) -> list[str]:
    """What in ``text`` a user could not open: private notes, a docs file that does not exist, a § it lacks."""
    bad = [m.group(0) for m in PRIVATE.finditer(text)]
    for m in DOC_SECTION.finditer(text):
        doc = ROOT / m.group(1)
        if not doc.is_file():
            bad.append(m.group(0))
            continue
        headings = set(re.findall(r"^## (\d+)\. ", doc.read_text(), flags=re.M))
        for n in [m.group(2), *re.findall(r"§(\d+)", m.group(3))]:
            if n not in headings:
                bad.append(f"{m.group(1)} §{n}")
    return bad
