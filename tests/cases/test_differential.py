"""Launches drawn by the differential harness (scripts/vllm_differential.py) on which Preflight and vLLM's own
parser and ``create_engine_config`` agreed, or once disagreed and were fixed, kept as cases with vLLM's verdict
(tests/cases/differential): a refusal keeps the Preflight rule that matched vLLM's; an accept must stay free of errors
other than those vLLM's configuration code cannot see (memory, per-rank shapes: the harness's BEYOND_CONFIG)."""

from __future__ import annotations

import pathlib
import sys

import pytest

from service.domain.request import LaunchRequest
from service.domain.validate import validate
from tests.cases.test_handed import _judge
from tests.support import case_files, case_request, load_case

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
from vllm_differential import BEYOND_CONFIG  # noqa: E402

CASES = case_files("differential")


def test_there_are_differential_cases():
    kinds = {load_case(p)["expect"]["verdict"] for p in CASES}
    assert len(CASES) >= 20 and kinds == {"accept", "reject"}


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_differential_case(path):
    case = load_case(path)
    expect = case["expect"]
    result = validate(LaunchRequest.model_validate(case_request(case)), alternatives=False)
    findings = [f.as_dict() for f in result.findings]
    if expect["verdict"] == "accept":  # vLLM's config code cannot see memory or per-rank shapes: the harness's terms
        findings = [f for f in findings if f["rule"] not in BEYOND_CONFIG]
    assert _judge(expect, findings, result.verdict), (
        f"{case['id']}: vLLM {expect['verdict']}s ({case['notes']['vllm'].get('message', '')[:200]}); Preflight "
        f"{result.verdict}: {[(f['rule'], f['severity']) for f in findings if f['severity'] == 'error']}"
    )
