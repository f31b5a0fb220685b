"""The differential harness (scripts/vllm_differential.py): its generator, classification and report are tested
everywhere; a seeded sample judged by vLLM 0.33's own code runs where the generator's environment is present
(PREFLIGHT_VLLM_WORK, default /tmp/preflight-vllm-gen, holding the harness environment and releases/0.33.0 after
``make differential``) and is skipped otherwise."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import vllm_differential as diff  # noqa: E402
from gen_vllm_catalogue import env_dir  # noqa: E402

WORK = pathlib.Path(os.environ.get("PREFLIGHT_VLLM_WORK", "/tmp/preflight-vllm-gen"))
HAVE_VLLM = (env_dir(WORK, None, diff.HARNESS_SUPPORT) / ".ready").exists() and (
    WORK / "releases" / "0.33.0" / "vllm"
).exists()


def test_the_generator_is_seeded_and_draws_from_the_whole_option_table():
    a, b = diff.make_cases("0.33.0", 300, seed=4), diff.make_cases("0.33.0", 300, seed=4)
    assert a == b
    assert a != diff.make_cases("0.33.0", 300, seed=5)
    drawn = {k for c in a for k in c["engine_args"]}
    assert len(drawn) > 120  # far beyond the hand-picked dimensions
    assert not drawn & diff.NOT_DRAWN
    assert {c["model"] for c in a} >= {"meta-llama/Meta-Llama-3.1-8B", "Qwen/Qwen3-30B-A3B"}


def test_an_abbreviated_option_is_typed_as_given():
    _, line = diff.resolve_version("0.33.0")
    argv = diff.argv_of(line, {"tensor_parallel_size": 4}, {"tensor_parallel_size": "--tensor-par"})
    assert argv == ["vllm", "serve", "{MODEL}", "--tensor-par", "4"]


def test_argv_uses_the_release_spellings():
    _, line = diff.resolve_version("0.33.0")
    argv = diff.argv_of(line, {"tensor_parallel_size": 4, "enforce_eager": True, "compilation_config": {"mode": 3}})
    assert argv == ["vllm", "serve", "{MODEL}", "--tensor-parallel-size", "4", "--enforce-eager",
                    "--compilation-config", '{"mode":3}']  # fmt: skip


@pytest.mark.parametrize(
    ("vllm", "errors", "kind"),
    [
        ("accept", [], "agree_accept"),
        ("accept", ["weights_fit"], "beyond_config"),
        ("accept", ["tp_heads_divisible"], "false_reject"),
        ("reject", ["tp_heads_divisible"], "agree_reject"),
        ("reject", [], "missed_reject"),
        ("reject", ["kv_pool_empty"], "memory_only"),
        ("harness", ["tp_heads_divisible"], "harness"),
    ],
)
def test_classify(vllm, errors, kind):
    assert diff.classify({"verdict": vllm, "message": "m"}, {"verdict": "x", "errors": errors}) == kind


def test_causes_group_vllm_messages_by_shape():
    a = diff.cause(
        "missed_reject", {"message": "Value error, max_num_active_seqs (512) cannot be greater than 256."}, {}
    )
    b = diff.cause("missed_reject", {"message": "Value error, max_num_active_seqs (8) cannot be greater than 4."}, {})
    assert a == b == "Value error, max_num_active_seqs (N) cannot be greater than N."


def test_docs_render_the_reports():
    report = diff.summarize("0.33.0", 3, 1, [({}, {"verdict": "accept"}, {"errors": []}, "agree_accept"),
                                             ({}, {"verdict": "reject", "message": "x 1"}, {"errors": []}, "missed_reject"),
                                             ({}, {"verdict": "reject"}, {"errors": ["tp_heads_divisible"]}, "agree_reject")], 1.0)  # fmt: skip
    report["families"] = {"tp_heads_divisible": {"agree_reject": 1}}
    text = diff.render_docs([report])
    assert "| 0.33.0 | 3 | 3 | 66.7 % | 100.0 % | 50.0 % | 0 | 1 | 0 | 0 | 0 | 0 |" in text
    assert "- 1 × x N" in text


def test_a_refusal_by_the_loading_policy_alone_is_neither_agreement_nor_a_false_reject():
    accept = {"verdict": "accept"}
    assert diff.classify(accept, {"errors": ["write_not_allowed"]}) == "policy"
    assert diff.classify(accept, {"errors": ["write_not_allowed", "weights_fit"]}) == "policy"
    assert diff.classify(accept, {"errors": ["write_not_allowed", "tp_heads_divisible"]}) == "false_reject"
    report = diff.summarize("0.33.0", 2, 1, [({}, accept, {"errors": []}, "agree_accept"),
                                             ({}, accept, {"errors": ["write_not_allowed"]}, "policy")], 1.0)  # fmt: skip
    assert report["judged"] == 1 and report["agreement"]["both_ways"] == 1.0
    assert report["causes"]["policy"] == {"write_not_allowed": 1}


def test_the_checked_in_figures_are_current_with_the_docs():
    reports = sorted(
        (diff.json.loads(p.read_text()) for p in (ROOT / "docs" / "differential").glob("*.json")),
        key=lambda r: [int(x) for x in r["vllm_version"].split(".")],
    )
    assert reports, "docs/differential/*.json: run make differential"
    assert diff.DOCS.read_text() == diff.render_docs(reports)
    for r in reports:
        assert r["judged"] >= 0.9 * r["n"], r["vllm_version"]


@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM's throw-away environment is not present (make differential)")
def test_a_seeded_sample_agrees_with_vllm(tmp_path):
    report = diff.run("0.33.0", 40, 11, tmp_path, WORK, diff.HARNESS_TORCH, jobs=2)
    assert report["counts"].get("harness", 0) <= 4, report["causes"].get("harness")
    assert report["counts"].get("false_reject", 0) == 0, report["causes"].get("false_reject")


def test_a_parallel_size_both_refuse_is_agreement_and_vllms_verdicts_are_kept(tmp_path, monkeypatch):
    refuse, accept = (
        {"verdict": "reject", "message": "tensor_parallel_size: Input should be >= 1"},
        {"verdict": "accept"},
    )
    assert diff.classify(refuse, {"errors": ["input:range:workers"]}) == "agree_reject"
    assert diff.classify(accept, {"errors": ["input:range:workers"]}) == "beyond_config"
    calls = []

    def fake_vllm(version, cases, work, torch_spec, jobs):
        calls.append(len(cases))
        return {c["id"]: accept for c in cases}

    monkeypatch.setattr(diff, "vllm_verdicts", fake_vllm)
    monkeypatch.setattr(diff, "preflight_verdict", lambda version, case: {"verdict": "accept", "errors": []})
    first = diff.run("0.33.0", 5, 3, tmp_path, tmp_path, "torch", jobs=1)
    again = diff.run("0.33.0", 5, 3, tmp_path, tmp_path, "torch", jobs=1)
    assert calls == [5] and first["counts"] == again["counts"] == {"agree_accept": 5}
    diff.run("0.33.0", 6, 3, tmp_path, tmp_path, "torch", jobs=1)  # other launches: vLLM judges them
    assert calls == [5, 6]


def test_an_unknown_parser_is_the_same_reason_only_where_vllm_names_the_parser():
    """From 0.24 the config code looks the reasoning parser up (vllm/config/reasoning.py:77) and refuses an unknown
    one itself: Preflight's parser_unknown beside it is agreement; beside another refusal it is not vLLM's reason."""
    named = {"verdict": "reject", "message": "\"Reasoning parser '1' not found. Available parsers: qwen3\""}
    other = {"verdict": "reject", "message": "Value error, Chunked prefill must be enabled"}
    pf = {"errors": ["parser_unknown", "kv_pool_empty"]}
    assert diff.classify(named, pf) == "agree_reject"
    assert diff.classify(other, pf) == "memory_only"
    assert diff.classify({"verdict": "accept"}, pf) == "beyond_config"
