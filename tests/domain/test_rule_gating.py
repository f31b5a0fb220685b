"""A rule registered with ``when=(options…)`` is not called when none of those options is among the launch's engine
arguments (service/domain/rules/__init__.py ``run_rules``). The declaration is only safe if the rule finds nothing
without them: this runs every such rule's body without its options, on every release line and fixture family, and
on every launch case of the repository that does not give them."""

from __future__ import annotations

import pathlib
import sys

import pytest

from service.domain.context import build_context
from service.domain.errors import DomainError
from service.domain.memory.budget import compute_budget
from service.domain.request import LaunchRequest
from service.domain.rules import RULES, run_rules
from service.domain.versions import version_lines
from tests.support import case_files, case_request, load_case, request

GATED = [info for info in RULES if info.when]
FAMILIES = {  # dense, MoE, MLA + MTP, hybrid Mamba, gated-delta hybrid with MTP, multimodal MoE, remote-code
    "meta-llama__Meta-Llama-3.1-70B": {"tensor_parallel_size": 8},
    "Qwen__Qwen3-30B-A3B": {"tensor_parallel_size": 2},
    "deepseek-ai__DeepSeek-V3": {"tensor_parallel_size": 8},
    "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": {"tensor_parallel_size": 2},
    "Qwen__Qwen3.5-35B-A3B": {"tensor_parallel_size": 2},
    "meta-llama__Llama-4-Scout-17B-16E-Instruct": {"tensor_parallel_size": 8},
    "moonshotai__Kimi-K2.5": {"tensor_parallel_size": 8},
}


def _context(raw: dict):
    ctx = build_context(LaunchRequest.model_validate(raw))
    ctx.budget = compute_budget(ctx)
    return ctx


def _silent(ctx) -> list[str]:
    """The gated rules that would find something although none of their options is given."""
    given = ctx.args.values.keys()
    return [
        f"{info.name}: {[f.rule for f in info.body(ctx, info.emit)]}"
        for info in GATED
        if given.isdisjoint(info.when) and info.body(ctx, info.emit)
    ]


def test_there_are_gated_rules():
    assert len(GATED) >= 20
    assert all(info.body is not None and info.emit is not None for info in GATED)


@pytest.mark.parametrize("version", [line.newest for line in version_lines()])
@pytest.mark.parametrize("model", sorted(FAMILIES))
def test_gated_rules_find_nothing_without_their_options(version, model):
    for environment in ("production", "benchmark"):
        raw = request(model, environment=environment, **FAMILIES[model])
        raw["vllm_version"] = version
        raw["engine_args"]["trust_remote_code"] = True
        try:
            ctx = _context(raw)
        except DomainError:  # a family this release cannot load: nothing to run
            continue
        assert _silent(ctx) == [], (version, model, environment)


CASES = case_files("handed") + case_files("differential") + case_files("kv")


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_gated_rules_on_every_case(path):
    try:
        ctx = _context(case_request(load_case(path)))
    except (DomainError, ValueError):  # a case refused before any rule runs
        return
    assert _silent(ctx) == []


def test_run_rules_skips_only_what_is_silent():
    """With the options given, a gated rule runs: a launch that needs it is still refused."""
    raw = request("meta-llama__Meta-Llama-3.1-70B", tensor_parallel_size=8, enable_auto_tool_choice=True)
    raw["vllm_version"] = "0.33.0"
    ctx = _context(raw)
    found = {f.rule for f in run_rules(ctx, "config")}
    assert "serve_option_pair" in found


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
import vllm_differential as diff  # noqa: E402


@pytest.mark.parametrize("version", ["0.33.0", "0.24.0", "0.13.0", "0.10.2", "0.7.3"])
def test_gated_rules_on_drawn_launches(version):
    """Launches drawn by the differential harness's generator: every fixture model, GPUs, parallel sizes and 0-4
    further options from the release's whole option table at valid and invalid values."""
    loud = []
    for case in diff.make_cases(version, 300, seed=17):
        raw = {
            "vllm_version": version,
            "model": {"name": case["model"], "config": case["files"]["config.json"]},
            "hardware": {"gpu": case["gpu"], "count": case["count"], "nodes": 1, "interconnect": "nvlink"},
            "environment": "production",
            "engine_args": case["engine_args"],
        }
        try:
            ctx = _context(raw)
        except (DomainError, ValueError):
            continue
        loud += [f"{case['id']}: {s}" for s in _silent(ctx)]
    assert loud == []
