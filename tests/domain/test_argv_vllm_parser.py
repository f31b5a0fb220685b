"""Every signed argv the catalogue tests produce, parsed by vLLM 0.33's own parser (scripts/check_argv_with_vllm.py):
runs where a vLLM release is available — set PREFLIGHT_VLLM_PYTHON (an interpreter with vLLM's dependencies, e.g.
/tmp/preflight-vllm-gen/env/bin/python after scripts/gen_vllm_catalogue.py) and PREFLIGHT_VLLM_PYTHONPATH (the
unpacked release, e.g. /tmp/preflight-vllm-gen/releases/0.33.0); skipped otherwise."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

from service.domain.render import validated_arguments
from service.domain.request import LaunchRequest
from service.domain.topology import group_arguments, member_argvs, node_arguments, node_argv, plan_topology
from service.domain.validate import validate
from tests.support import request
from tests.support.catalogue import JUDGED_ELSEWHERE, LINE, OPTIONS, valid_value
from tests.support.recipes import RECIPES

PYTHON = os.environ.get("PREFLIGHT_VLLM_PYTHON")
RELEASE = os.environ.get("PREFLIGHT_VLLM_PYTHONPATH")
SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "check_argv_with_vllm.py"


def cases():
    out = []

    def add(req):
        r = validate(LaunchRequest.model_validate(req), alternatives=False)
        assert not [f for f in r.errors if f.rule in ("argv_roundtrip", "model_reference", "flag_unsupported")]
        out.append((r, validated_arguments(r.context)))

    for name in OPTIONS:
        if name not in JUDGED_ELSEWHERE:
            req = request("meta-llama__Meta-Llama-3.1-8B", count=1)
            req["engine_args"] = {name: valid_value(LINE.options[name])}
            req["model"]["uri"] = "meta-llama/Llama-3.1-8B"
            add(req)
    for _, model, hw, nodes, args in RECIPES:
        req = request(model, gpu=hw[0], count=hw[1], nodes=nodes, environment="benchmark")
        req["engine_args"], req["model"]["uri"] = args, "org/" + model.split("__", 1)[1]
        add(req)
    lines = [{"argv": r.argv, "expected": exp, "model": r.argv[2]} for r, exp in out]
    r, exp = out[-1]
    topo = plan_topology(["a", "b"], 1, 2, 1, 1, LINE)  # a two-node instance of the last recipe's command
    for n in ("a", "b"):
        extra = node_arguments(topo, topo.placements[n], LINE, head_address="10.1.2.3", tp=2, pp=1, dp=1)
        lines.append({"argv": node_argv(r.argv, extra, LINE), "expected": {**exp, **extra}, "model": r.argv[2]})
    return lines + multi_node_cases()


# Multi-node layouts vLLM 0.33 documents (docs/serving/parallelism_scaling.md, data_parallel_deployment.md), each
# node's argv as plans.create signs it: (fixture, gpu, GPUs per node, nodes, engine_args, form)
MULTI_NODE = [
    ("deepseek-ai__DeepSeek-V3", "h200-141gb", 8, 2, {"tensor_parallel_size": 16, "max_model_len": 32768}, None),
    ("deepseek-ai__DeepSeek-V3", "h200-141gb", 8, 4, {"tensor_parallel_size": 16, "max_model_len": 32768}, None),
    (
        "meta-llama__Llama-4-Maverick-17B-128E-Instruct",
        "h200-141gb",
        8,
        2,
        {"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "max_model_len": 32768},
        None,
    ),
    (
        "deepseek-ai__DeepSeek-V3",
        "h200-141gb",
        8,
        2,
        {"tensor_parallel_size": 4, "data_parallel_size": 4, "enable_expert_parallel": True, "max_model_len": 16384},
        None,
    ),
    (
        "deepseek-ai__DeepSeek-V3",
        "h200-141gb",
        8,
        2,
        {"tensor_parallel_size": 4, "data_parallel_size": 4, "enable_expert_parallel": True, "max_model_len": 16384},
        "data_parallel",
    ),
    (
        "meta-llama__Meta-Llama-3.1-70B",
        "h100-sxm-80gb",
        8,
        2,
        {"tensor_parallel_size": 8, "max_model_len": 8192},
        None,
    ),  # replicas: the same argv on both nodes
]


def multi_node_cases() -> list[dict]:
    out = []
    for model, gpu, count, n, args, form in MULTI_NODE:
        names = [f"node-{i}" for i in range(n)]
        tp, pp, dp = (args.get(k, 1) for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"))
        topo = plan_topology(names, count, tp, pp, dp, LINE, form=form)
        req = request(model, gpu=gpu, count=count, nodes=topo.nodes_per_instance, environment="benchmark")
        req["engine_args"] = {**args, **group_arguments(topo, LINE, tp=tp, pp=pp, given={})}
        req["model"]["uri"] = "org/" + model.split("__", 1)[1]
        r = validate(LaunchRequest.model_validate(req), alternatives=False)
        assert r.verdict != "reject", [f.message for f in r.errors]
        for g in range(len(topo.groups)):
            argvs, expected = member_argvs(topo, g, r.argv, LINE, head_address=f"10.0.{g}.1", tp=tp, pp=pp, dp=dp)
            for name, argv in argvs.items():
                out.append(
                    {"argv": argv, "expected": expected.get(name, validated_arguments(r.context)), "model": argv[2]}
                )
    return out


@pytest.mark.skipif(
    not (PYTHON and RELEASE), reason="no vLLM release configured (PREFLIGHT_VLLM_PYTHON / PREFLIGHT_VLLM_PYTHONPATH)"
)
def test_vllms_own_parser_reads_every_signed_argv_as_validated(tmp_path):  # pragma: no cover - needs vLLM
    path = tmp_path / "argvs.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in cases()))
    res = subprocess.run(
        [PYTHON, str(SCRIPT), str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": RELEASE},
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert res.stdout.strip().endswith("0 mismatches")


def test_the_cases_are_built_without_vllm():
    assert len(cases()) > 300


def test_multi_node_cases_are_each_nodes_own_command():
    lines = multi_node_cases()
    assert len(lines) == 2 + 4 + 2 + 2 + 2 + 2
    tp16 = lines[:2]
    assert tp16[0]["expected"]["node_rank"] == 0 and tp16[1]["expected"]["node_rank"] == 1
    assert "--headless" in tp16[1]["argv"] and "--headless" not in tp16[0]["argv"]
    assert {x["expected"]["master_addr"] for x in lines[2:6]} == {"10.0.0.1", "10.0.1.1"}
    dp_head, dp_follower = lines[10], lines[11]
    assert (
        dp_follower["expected"]["data_parallel_start_rank"] == 2
        and "data_parallel_start_rank" not in dp_head["expected"]
    )
    assert lines[-1]["argv"] == lines[-2]["argv"] and "--nnodes" not in lines[-1]["argv"]
