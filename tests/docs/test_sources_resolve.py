"""Every ``source`` and citation a user sees points to something they can open: a vLLM file and line, a file of this
repository, or a section of this repository's docs (docs/operating.md §N) — never the team's private notes."""

from __future__ import annotations

import pytest

from service.domain.request import LaunchRequest
from service.domain.rules import RULES
from service.domain.validate import validate
from tests.support import case_files, case_request, load_case
from tests.support.sources import ROOT, unresolved


def test_rule_sources_and_descriptions_resolve():
    for info in RULES:
        assert not unresolved(info.source), (info.codes, info.source)
        assert not unresolved(info.what), (info.codes, unresolved(info.what))


def test_the_generated_rule_catalogue_resolves():
    assert not unresolved((ROOT / "docs" / "rules.md").read_text())


def test_a_missing_section_is_caught():
    assert unresolved("see docs/operating.md §42") == ["docs/operating.md §42"]
    assert unresolved("GUIDE.md §3") == ["GUIDE.md"]
    assert unresolved("docs/operating.md §3, §5") == []


@pytest.mark.parametrize("path", case_files("handed"), ids=lambda p: p.stem)
def test_findings_and_recommendations_cite_what_a_user_can_open(path):
    case = load_case(path)
    result = validate(LaunchRequest.model_validate(case_request(case)), model_ref="s3://weights/model")
    for f in result.findings:
        assert not unresolved(f"{f.source} {f.message}"), (f.rule, f.source, f.message)
    for r in result.recommendations:
        assert not unresolved(str(r)), r
