"""docs/rules.md is generated from the rule registry and must stay current; every rule documents itself."""

from __future__ import annotations

import pathlib

from service.domain.rules import RULES
from service.domain.rules.catalogue import render_markdown

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "rules.md"


def test_docs_rules_md_is_current():
    assert DOCS.read_text() == render_markdown(), (
        "docs/rules.md is stale: run `python -m service.domain.rules.catalogue > docs/rules.md`")


def test_every_rule_has_source_docstring_and_codes():
    assert RULES
    for info in RULES:
        assert info.source.strip(), info.name
        assert info.what.strip(), info.name
        assert info.codes and all(c and c == c.lower() for c in info.codes), info.name
        assert info.severity in ("error", "warning", "info"), info.name
        assert info.phase in ("config", "budget"), info.name


def test_every_code_appears_in_the_catalogue():
    text = render_markdown()
    for info in RULES:
        for code in info.codes:
            assert f"`{code}`" in text
