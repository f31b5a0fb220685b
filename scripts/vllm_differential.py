"""Differential harness: Preflight's verdicts beside vLLM's own, on thousands of drawn launches.

    .venv/bin/python scripts/vllm_differential.py --vllm 0.33.0:300 --seed 5        # one release, 300 launches
    make differential        # 0.33.0:2000, 0.24.0:500, 0.13.0:500, 0.10.2:500 and docs/differential.md

A seeded generator draws launches over the fixture models (tests/fixtures/models) × catalogue GPUs × parallel
sizes × dtype × quantization × KV-cache dtype × lengths × 0–4 further options from the release's whole option
table (valid, invalid and interacting values). Each launch is judged twice:
- by vLLM itself: scripts/vllm_differential_inside.py, in the catalogue generator's throw-away environment for that
  release (scripts/gen_vllm_catalogue.py: CPU torch, the wheel with ``--no-deps``), runs the release's parser,
  its serve-level checks and ``EngineArgs.create_engine_config()`` with the platform answering as the case's GPU;
- by Preflight: ``validate()`` on the same launch (environment ``benchmark``: operators' policy is not vLLM's).
vLLM's configuration code cannot see what happens later on the GPU (memory, per-rank shapes in the worker): a
Preflight error of those rules (``BEYOND_CONFIG``) beside vLLM's accept is counted apart, not as a disagreement.

Output (``--out``, default /tmp/preflight-differential/<release>/; give concurrent runs their own): ``report.json``
(counts, agreement both ways, disagreements grouped by cause), one case file per disagreement and a few agreeing
launches per rule, in the tests/cases format with vLLM's verdict: agreeing ones are regression cases for
tests/cases/differential/, disagreements are reviewed into a fix and a case. ``--docs`` writes the run's reports to
docs/differential/<release>.json and regenerates docs/differential.md from every report there.

Needs: network to PyPI on first use, ~6 GB for the harness environment (a CUDA build of torch with torchvision, used on
the CPU) and ~5 GB of wheels and unpacked releases under ``--work``; about 1–3 s of CPU per launch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from gen_vllm_catalogue import ensure_env, release_dir  # noqa: E402

from service.domain.engine_args import resolve_name  # noqa: E402
from service.domain.errors import DomainError  # noqa: E402
from service.domain.gpus import catalogue  # noqa: E402
from service.domain.render import render_option  # noqa: E402
from service.domain.request import LaunchRequest  # noqa: E402
from service.domain.versions import (  # noqa: E402  # noqa: E402
    K_BOOL,
    K_BOOL_VALUE,
    K_FLAG,
    K_FLOAT,
    K_INT,
    K_JSON,
    K_JSON_OR_STR,
    K_SIZE,
    K_SIZE_OR_AUTO,
    K_STR,
    VersionLine,
    resolve_version,
)

MODELS = ROOT / "tests" / "fixtures" / "models"
INSIDE = ROOT / "scripts" / "vllm_differential_inside.py"
DOCS = ROOT / "docs" / "differential.md"
# Preflight rules about what vLLM's configuration code cannot see: memory on the GPU, per-rank shapes built in the
# worker, kernels the wheel ships. vLLM accepting such a launch at config time is no disagreement.
BEYOND_CONFIG = {
    "weights_fit",
    "kv_pool_empty",
    "kv_cache_fits_max_len",
    "kv_cache_memory_fits",
    "max_num_seqs_above_bound",
    "max_num_seqs_above_bound_at_max_len",
    "util_exceeds_free",
    "tp_kv_heads",
    "tp_mlp_divisible",
    "tp_vocab_divisible",
    "quant_group_alignment",
    "fp8_block_alignment",
    "gpu_min_capability",
    "bf16_capability",
    "fp8_weight_only",
    "kv_dtype_capability",
    "world_size_exceeds_gpus:data_parallel",
    "nnodes:hardware",
    # a parallel size below 1 or of thousands of ranks: releases before the bounds on ParallelConfig (0.33 refuses
    # them there) take it in their config code, and the engine cannot start that many (or fewer than one) workers
    "input:range:workers",
    # no sequence or no token per step (max_num_seqs / max_num_batched_tokens below 1): releases before the bounds on
    # SchedulerConfig (0.33 refuses them there) take it in their config code, and the engine can then schedule nothing
    "input:range:scheduler",
    # checks vLLM makes when the OpenAI server sets itself up, after the engine config: a reasoning or tool parser
    # the release does not register (vllm 0.13.0 vllm/entrypoints/openai/serving_engine.py:288-301,
    # entrypoints/openai/cli_args.py tool parser check at server start); the harness runs the config code only
    "parser_unknown",
    # before 0.33 an architecture without LoRA support is refused when the worker builds the model (the LoRA
    # manager: "<arch> does not support LoRA yet"), not by the config code the harness runs
    "lora_unsupported_model",
}
# Preflight's own loading policy (service/domain/loading.py: what a signed plan may write, read, load as code or carry
# as a secret), which vLLM does not have: a refusal for it alone beside vLLM's accept is counted apart ("policy"),
# neither as agreement nor as a false reject
POLICY = {
    "write_not_allowed",
    "path_not_allowed",
    "code_not_allowed",
    "env_not_allowed",
    "secret_in_engine_args",
    "flag_unjudged",
}
# A Preflight error beyond the config code that is vLLM's own reason where vLLM refuses: any refusal (0.33's
# ParallelConfig bounds, ge=1, refuse what the size errors refuse), or one whose message matches (the
# config code of later lines looks the reasoning parser up: vllm 0.24.0 vllm/config/reasoning.py:77)
SAME_REASON_WHEN_REFUSED: dict[str, re.Pattern[str] | None] = {
    "input:range:workers": None,
    "input:range:scheduler": None,
    "lora_unsupported_model": None,
    "parser_unknown": re.compile(r"parser '.*' (not found|is not registered)|[Pp]arser .* not found"),
}
WORKER_SIZES = {
    f"engine_args.{n}"
    for n in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "decode_context_parallel_size")
}
SCHEDULER_SIZES = {f"engine_args.{n}" for n in ("max_num_seqs", "max_num_batched_tokens")}
# Options not drawn: what names other files, hosts or code (the harness has no network and no files but the
# config.json), and what Preflight refuses by policy rather than by vLLM's rules.
NOT_DRAWN = {
    "model",
    "tokenizer",
    "revision",
    "code_revision",
    "tokenizer_revision",
    "hf_token",
    "download_dir",
    "load_format",
    "config",
    "hf_config_path",
    "model_loader_extra_config",
    "hf_overrides",
    "quantization_config",
    "served_model_name",
    "speculative_model",
    "spec_model",  # a draft model by name: the harness has neither the network nor the files to load it
    "lora_modules",
    "prompt_adapters",
    "chat_template",
    "headless",
    "api_server_count",
    "data_parallel_address",
    "data_parallel_rpc_port",
    "port",
    "host",
    "uds",
    "trust_remote_code",
    "allowed_local_media_path",
    "allowed_media_domains",
    "seed",
    "config_format",
    "tokenizer_mode",
    "tool_parser_plugin",
    "reasoning_parser_plugin",
    "root_path",
    "middleware",
}
# Real packages beside the generator's (the rest is mocked by the inside script): vLLM's model modules import triton
# unguarded on CUDA (0.10 vllm_flash_attn/ops/triton/rotary.py:8), Transformers' image processors need Pillow, and
# vllm/v1/utils.py imports uvloop (fastapi[standard], a requirement of vLLM, brings it); multimodal models' processors
# import torchvision, which needs the torch it was built with (HARNESS_TORCH; a CUDA build, ~5.5 GB, runs on the CPU).
HARNESS_TORCH = "torch==2.14.1"
HARNESS_SUPPORT = ("pillow", "triton", "fastapi[standard]", "torchvision==0.29.1")
GPUS = ("h100-sxm-80gb", "a100-sxm4-80gb", "a100-sxm4-40gb", "l40s", "l4", "a10g", "rtx-4090", "h200", "b200", "t4")


def fixtures() -> list[tuple[str, dict, dict | None]]:
    out = []
    for d in sorted(p for p in MODELS.iterdir() if (p / "config.json").exists()):
        hq = d / "hf_quant_config.json"
        out.append(
            (
                d.name.replace("__", "/", 1),
                json.loads((d / "config.json").read_text()),
                json.loads(hq.read_text()) if hq.exists() else None,
            )
        )
    return out


def _gpu_ids() -> list[str]:
    known = catalogue()
    return [g for g in GPUS if g in known] or sorted(known)[:8]


def draw_value(rng: random.Random, opt, name: str) -> Any:
    """A value for one option: mostly what the release offers, sometimes what it refuses."""
    if opt.kind in (K_BOOL, K_FLAG, K_BOOL_VALUE):
        return rng.random() < 0.7
    if opt.choices:
        return rng.choice(list(opt.choices)) if rng.random() < 0.85 else "bogus"
    if opt.kind in (K_INT, K_SIZE, K_SIZE_OR_AUTO):
        return rng.choice([0, 1, 2, 4, 16, 256, 4096, 100000, -1])
    if opt.kind is K_FLOAT:
        return rng.choice([0.0, 0.5, 0.9, 1.0, 2.0, 30.0])
    if opt.kind in (K_JSON, K_JSON_OR_STR):
        keys = sorted((opt.json_keys or {}).get("keys") or {})
        if keys and rng.random() < 0.8:
            return {rng.choice(keys): rng.choice([True, False, 1, 4, 0.5, "auto", "none", -1])}
        return {"no_such_key": 1}
    if opt.kind is K_STR:
        return rng.choice(["auto", "none", "x", "1"])
    return None


INTERACTIONS: list[dict[str, Any]] = [
    {"speculative_config": {"num_speculative_tokens": 3}},
    {
        "speculative_config": {
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": 5,
            "prompt_lookup_max": 2,
        }
    },
    {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}},
    {"enable_auto_tool_choice": True},
    {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"},
    {"enable_chunked_prefill": False, "max_num_batched_tokens": 2048},
    {"enable_chunked_prefill": False, "max_num_batched_tokens": 131072},
    {"data_parallel_size": 2, "data_parallel_size_local": 4},
    {"data_parallel_size": 2},
    {"enable_lora": True, "max_loras": 0},
    {"enable_lora": True, "max_loras": 4, "max_cpu_loras": 2},
    {"enable_lora": True, "max_loras": 2, "max_lora_rank": 64},
    {"enable_log_outputs": True},
    {"enable_log_outputs": True, "enable_log_requests": True},
    {"enable_expert_parallel": True},
    {"enable_prefix_caching": True, "enable_chunked_prefill": False},
    {"max_num_seqs": 512, "max_num_batched_tokens": 256},
    {"kv_cache_dtype": "fp8_inc"},
    {"pipeline_parallel_size": 2},
    {"decode_context_parallel_size": 2},
]


def draw_launch(
    rng: random.Random, line: VersionLine, models, gpu_ids
) -> tuple[str, dict, dict | None, str, int, dict]:
    name, config, hq = rng.choice(models)
    gpu = rng.choice(gpu_ids)
    count = rng.choice([1, 2, 4, 8, 8, 8])
    args: dict[str, Any] = {}
    tp = rng.choice([t for t in (1, 2, 4, 8) if t <= count] + [3] * (rng.random() < 0.05))
    if tp > 1:
        args["tensor_parallel_size"] = tp
    for dest, values in (
        ("dtype", ["auto", "bfloat16", "float16", "half", "float32"]),
        ("kv_cache_dtype", ["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]),
        ("max_model_len", [2048, 8192, 32768, 131072, 1048576]),
        ("quantization", ["fp8", "awq", "gptq", "bitsandbytes"]),
        ("enforce_eager", [True]),
    ):
        if dest in line.options and rng.random() < 0.25:
            args[dest] = rng.choice(values)
    if rng.random() < 0.3:
        args.update(rng.choice(INTERACTIONS))
    drawable = sorted(d for d in line.options if d not in NOT_DRAWN and d not in line.loading.options)
    for dest in rng.sample(drawable, rng.choice([0, 0, 1, 2, 3, 4])):
        value = draw_value(rng, line.options[dest], dest)
        if value is not None:
            args[dest] = value
    args = {k: v for k, v in args.items() if k in line.options}
    return name, config, hq, gpu, count, args


def abbreviate(rng: random.Random, line: VersionLine, args: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Sometimes give one option as a prefix of its long spelling (argparse's ``allow_abbrev``): unique or not."""
    names = [d for d in args if line.options[d].flag in render_option(line.options[d], args[d])]
    if not names or rng.random() > 0.12:
        return args, {}
    dest = rng.choice(names)
    flag = line.options[dest].flag
    prefix = flag[: rng.randint(max(4, len(flag) // 2), len(flag) - 1)]
    out = {(prefix if k == dest else k): v for k, v in args.items()}
    return out, {dest: prefix}


def argv_of(line: VersionLine, args: dict[str, Any], spelled: dict[str, str] | None = None) -> list[str]:
    argv = ["vllm", "serve", "{MODEL}"]
    for dest, value in args.items():
        opt = line.options[dest]
        rendered = (
            render_option(opt, value) if not isinstance(value, str) or opt.kind is not K_BOOL else [opt.flag, value]
        )
        if spelled and dest in spelled:  # the abbreviation as typed, in place of the option's own spelling
            rendered = [spelled[dest] if a == opt.flag else a for a in rendered]
        argv += rendered
    return argv


def gpu_facts(gpu_id: str, count: int) -> dict[str, Any]:
    g = catalogue()[gpu_id]
    name = g.nvidia_smi_names[0] if g.nvidia_smi_names else g.name
    cap = "{}.{}".format(*g.compute_capability) if g.compute_capability else "8.0"
    return {"name": name, "compute_capability": cap, "memory_bytes": g.memory_bytes, "count": count, "nvlink": g.nvlink}


def make_cases(version: str, n: int, seed: int) -> list[dict[str, Any]]:
    _, line = resolve_version(version)
    rng = random.Random(seed)
    models, gpu_ids = fixtures(), _gpu_ids()
    cases = []
    for i in range(n):
        name, config, hq, gpu, count, args = draw_launch(rng, line, models, gpu_ids)
        files = {"config.json": config, **({"hf_quant_config.json": hq} if hq else {})}
        given, spelled = abbreviate(rng, line, args)
        cases.append(
            {
                "id": f"d{seed}-{i:05d}",
                "vllm_version": version,
                "model": name,
                "gpu": gpu,
                "count": count,
                "engine_args": given,
                "argv": argv_of(line, args, spelled),
                "files": files,
            }
        )
    return cases


def finding_args(case: dict[str, Any]) -> dict[str, Any]:
    """The case's engine arguments by dest (an abbreviated key read as the release reads it)."""
    _, line = resolve_version(case.get("vllm_version"))
    out = {}
    for key, value in case["engine_args"].items():
        try:
            out[resolve_name(key, line)] = value
        except DomainError:
            out[str(key)] = value
    return out


def _code(finding, case: dict[str, Any]) -> str:
    """A finding's rule, with the part vLLM's configuration code cannot see told apart: TP × PP above the GPUs is
    refused by ParallelConfig, but data-parallel ranks above them only when the engine cores take their devices."""
    if finding.rule == "world_size_exceeds_gpus":
        args = finding_args(case)
        world = int(args.get("tensor_parallel_size", 1)) * int(args.get("pipeline_parallel_size", 1))
        world *= int(args.get("prefill_context_parallel_size", 1))  # a rank's world is PP × TP × PCP
        if world <= case["count"]:
            return "world_size_exceeds_gpus:data_parallel"
    if finding.rule == "nnodes" and "but the hardware has" in finding.message:
        return "nnodes:hardware"  # --nnodes against the nodes the launch really has: vLLM's head waits for them
    return finding.rule


def preflight_verdict(version: str, case: dict[str, Any]) -> dict[str, Any]:
    files = case["files"]
    request = {
        "vllm_version": version,
        "model": {
            "name": case["model"],
            "config": files["config.json"],
            "hf_quant_config": files.get("hf_quant_config.json"),
        },
        "hardware": {"gpu": case["gpu"], "count": case["count"], "nodes": 1, "interconnect": "nvlink"},
        "environment": "benchmark",
        "engine_args": case["engine_args"],
    }
    from service.domain.validate import validate

    try:
        result = validate(LaunchRequest.model_validate(request), alternatives=False)
    except DomainError as e:
        code = f"input:{e.rule or 'bad_input'}"
        if e.rule == "range" and e.field in WORKER_SIZES | SCHEDULER_SIZES:
            code += ":workers" if e.field in WORKER_SIZES else ":scheduler"
        return {"verdict": "reject", "errors": [code], "message": e.message[:300]}
    except ValueError as e:  # pydantic: the request itself is refused (422)
        return {"verdict": "reject", "errors": ["input:request"], "message": str(e)[:300]}
    errors = sorted({_code(f, case) for f in result.findings if f.severity.value == "error"})
    first = next((f.message for f in result.findings if f.severity.value == "error"), "")
    return {"verdict": "reject" if errors else "accept", "errors": errors, "message": first[:300]}


def vllm_verdicts(
    version: str, cases: list[dict[str, Any]], work: pathlib.Path, torch_spec: str, jobs: int = 2
) -> dict[str, dict]:
    """vLLM's verdict per case id: one process per GPU model (the platform answers for one GPU)."""
    spec = json.loads((ROOT / "service/data/vllm" / f"{version}.json").read_text())["source"].get(
        "transformers_requirement"
    )
    py = ensure_env(work, torch_spec, spec, HARNESS_SUPPORT)
    env = {
        "PYTHONPATH": str(release_dir(version, py, work)),
        "CUDA_VISIBLE_DEVICES": "",
        "PATH": "/usr/bin:/bin",
        "HOME": str(work),
        "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
    }
    groups: dict[str, list[dict]] = defaultdict(list)
    for c in cases:
        groups[c["gpu"]].append(c)
    (work / "differential").mkdir(parents=True, exist_ok=True)
    run_dir = pathlib.Path(tempfile.mkdtemp(prefix=f"{version}-", dir=work / "differential"))  # runs may overlap

    def judge_group(gpu: str, group: list[dict]) -> dict[str, dict]:
        cases_file, gpu_file = run_dir / f"{gpu}.jsonl", run_dir / f"{gpu}.gpu.json"
        cases_file.write_text("\n".join(json.dumps(c) for c in group) + "\n")
        gpu_file.write_text(json.dumps(gpu_facts(gpu, 8)))
        proc = subprocess.run(
            [str(py), str(INSIDE), str(cases_file), str(gpu_file)], capture_output=True, text=True, env=env, cwd=work
        )
        got = {}
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                verdict = json.loads(line)
                got[verdict.pop("id")] = verdict
        died = (proc.stderr.strip().splitlines() or ["died"])[-1][:300]
        for c in group:  # a process that died leaves its remaining cases without a verdict
            got.setdefault(c["id"], {"verdict": "harness", "message": died})
        return got

    out: dict[str, dict] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for got in pool.map(lambda item: judge_group(*item), sorted(groups.items())):
            out.update(got)
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def _beyond_config(vllm: dict[str, Any]) -> set[str]:
    """BEYOND_CONFIG, and what this verdict puts beyond the config code: a world larger than one node's GPUs, for
    which the release's ParallelConfig picks the Ray backend instead of refusing (vllm 0.10.2
    vllm/config/parallel.py:384-392): Ray's placement group then waits for GPUs this node lacks when the executor
    starts (vllm 0.10.2 vllm/executor/ray_utils.py:347-380), after the config code."""
    if vllm.get("verdict") == "accept" and vllm.get("distributed_executor_backend") == "ray":
        return BEYOND_CONFIG | {"world_size_exceeds_gpus"}
    return BEYOND_CONFIG


def _same_reason(error: str, vllm: dict[str, Any]) -> bool:
    if error not in SAME_REASON_WHEN_REFUSED:
        return False
    said = SAME_REASON_WHEN_REFUSED[error]
    return said is None or bool(said.search(str(vllm.get("message", ""))))


def classify(vllm: dict[str, Any], pf: dict[str, Any]) -> str:
    if vllm["verdict"] == "harness":
        return "harness"
    config_errors = [e for e in pf["errors"] if e not in _beyond_config(vllm)]
    if vllm["verdict"] != "accept":  # a parallel size out of range is the same reason where vLLM refuses it too
        config_errors += [e for e in pf["errors"] if _same_reason(e, vllm)]
    if vllm["verdict"] == "accept":
        if not pf["errors"]:
            return "agree_accept"
        if config_errors and all(e in POLICY for e in config_errors):
            return "policy"
        return "false_reject" if config_errors else "beyond_config"
    if config_errors:
        return "agree_reject"
    return "memory_only" if pf["errors"] else "missed_reject"


def cause(kind: str, vllm: dict[str, Any], pf: dict[str, Any]) -> str:
    """What a disagreement is about: Preflight's rules for a false reject, vLLM's message shape otherwise."""
    if kind in ("false_reject", "policy"):
        return ", ".join(e for e in pf["errors"] if e not in BEYOND_CONFIG)
    text = re.sub(r"\d+(\.\d+)?", "N", vllm.get("message", ""))
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    return text.split(" [type=")[0][:120]


def keep_agreeing(kind: str, pf: dict[str, Any], kept: Counter, per_rule: int = 2, accepts: int = 20) -> bool:
    """A few agreeing launches as regression cases: the first ``per_rule`` refusals of each Preflight rule, the first
    ``accepts`` accepts."""
    if any(e.startswith("input:") for e in pf["errors"]):
        return False  # refused as bad input (422): not a launch case
    if kind == "agree_accept":
        kept["accept"] += 1
        return kept["accept"] <= accepts
    fresh = [e for e in pf["errors"] if e not in BEYOND_CONFIG and kept[e] < per_rule]
    for e in fresh:
        kept[e] += 1
    return bool(fresh)


def write_case(out: pathlib.Path, version: str, case: dict, vllm: dict, pf: dict, kind: str) -> None:
    name = case["model"].replace("/", "__")
    doc = {
        "id": f"diff-{version}-{case['id']}",
        "source": f"scripts/vllm_differential.py --vllm {version}: vLLM's parser and create_engine_config",
        "summary": f"{kind}: vLLM {vllm['verdict']}s ({vllm.get('message', '')[:160]}); Preflight {pf['verdict']}s ({', '.join(pf['errors'])})",
        "vllm_version": version,
        "model": {
            "name": case["model"],
            "config_fixture": name if (MODELS / name).exists() else None,
            "config": None if (MODELS / name).exists() else case["files"]["config.json"],
            "hf_quant_config": case["files"].get("hf_quant_config.json"),
            "quantization_txt": None,
            "checkpoint": {"layout": "merged"},
            "weights_bytes": None,
        },
        "hardware": {"gpu": case["gpu"], "count": case["count"], "nodes": 1, "interconnect": "nvlink"},
        "environment": "benchmark",
        "engine_args": case["engine_args"],
        "expect": {
            "verdict": vllm["verdict"],
            "rules": [e for e in pf["errors"] if e not in BEYOND_CONFIG] if kind == "agree_reject" else [],
        },
        "notes": {"argv": case["argv"], "vllm": vllm, "preflight": pf},
    }
    (out / f"{kind}-{case['id']}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def summarize(version: str, n: int, seed: int, rows: list[tuple[dict, dict, dict, str]], seconds: float) -> dict:
    kinds = Counter(k for *_, k in rows)
    judged = n - kinds["harness"] - kinds["policy"]  # policy refusals are Preflight's choice, not a verdict to compare
    accepted = kinds["agree_accept"] + kinds["false_reject"] + kinds["beyond_config"]
    refused = kinds["agree_reject"] + kinds["missed_reject"] + kinds["memory_only"]
    causes: dict[str, Counter] = defaultdict(Counter)
    for _case, vllm, pf, kind in rows:
        if kind in ("false_reject", "missed_reject", "memory_only", "harness", "policy"):
            causes[kind][cause(kind, vllm, pf) if kind != "harness" else vllm.get("message", "")[:120]] += 1
    return {
        "vllm_version": version,
        "n": n,
        "seed": seed,
        "judged": judged,
        "seconds": round(seconds, 1),
        "counts": dict(sorted(kinds.items())),
        "agreement": {
            "both_ways": round((kinds["agree_accept"] + kinds["agree_reject"] + kinds["beyond_config"]) / judged, 4)
            if judged
            else None,
            "vllm_accepts_preflight_accepts": round((accepted - kinds["false_reject"]) / accepted, 4)
            if accepted
            else None,
            "vllm_refuses_preflight_refuses": round(kinds["agree_reject"] / refused, 4) if refused else None,
        },
        "causes": {k: dict(v.most_common()) for k, v in sorted(causes.items())},
    }


INSIDE_FILES = ("vllm_differential_inside.py", "vllm_catalogue_inside.py")  # what judges on vLLM's side


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run(version: str, n: int, seed: int, out: pathlib.Path, work: pathlib.Path, torch_spec: str, jobs: int = 2) -> dict:
    t0 = time.monotonic()
    cases = make_cases(version, n, seed)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "vllm_verdicts.json"  # vLLM's side is the slow one: kept, so Preflight's side can be judged again
    key = {"vllm_version": version, "n": n, "seed": seed, "cases": _digest(json.dumps(cases, sort_keys=True).encode())}
    key["judge"] = _digest(b"".join((HERE / f).read_bytes() for f in INSIDE_FILES))
    old_run = json.loads(saved.read_text()) if saved.exists() else {}
    if old_run.get("key") == key:
        verdicts = old_run["verdicts"]
    else:
        verdicts = vllm_verdicts(version, cases, work, torch_spec, jobs)
        saved.write_text(json.dumps({"key": key, "verdicts": verdicts}) + "\n")
    for old in out.glob("*-d*.json"):
        old.unlink()
    rows = []
    kept: Counter = Counter()
    for case in cases:
        vllm, pf = verdicts[case["id"]], preflight_verdict(version, case)
        kind = classify(vllm, pf)
        rows.append((case, vllm, pf, kind))
        if kind in ("false_reject", "missed_reject", "memory_only"):
            write_case(out, version, case, vllm, pf, kind)
        elif kind in ("agree_reject", "agree_accept") and keep_agreeing(kind, pf, kept):
            write_case(out, version, case, vllm, pf, kind)
    report = summarize(version, n, seed, rows, time.monotonic() - t0)
    report["families"] = family_rows(rows)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def family_rows(rows: list[tuple[dict, dict, dict, str]]) -> dict[str, dict[str, int]]:
    """Per Preflight rule: how often it refused beside vLLM's refusal, and beside vLLM's accept."""
    out: dict[str, Counter] = defaultdict(Counter)
    for _, _, pf, kind in rows:
        for rule in pf["errors"]:
            if rule not in BEYOND_CONFIG and kind in ("agree_reject", "false_reject"):
                out[rule][kind] += 1
    return {k: dict(v) for k, v in sorted(out.items())}


# disagreements reviewed and left, with the reason (shown beside the cause in docs/differential.md)
KNOWN = {
    "argv_roundtrip": (
        "--max-model-len 0: Preflight derives max_num_seqs 0 from it and its own round trip of the signed argv refuses "
        "that; vLLM 0.10.2's config code takes a length of 0 (a launch that can serve no token)"
    ),
    "Value error, rope_scaling should have a '…' key": (
        "DeepSeek-V4 on 0.10.2, refused by vLLM under every Transformers the release admits: 5.x nests its rope "
        "dicts per attention type, which 0.10.2's patch_rope_scaling (transformers_utils/config.py:376-391) "
        "refuses; 4.x does not know the model type. Preflight warns arch_unsupported and refuses for memory only"
    ),
    "--grpc-port requires VLLM_USE_RUST_FRONTEND=N vllm serve": (
        "by design a warning (grpc_port) where the plan's env leaves VLLM_USE_RUST_FRONTEND unset: the node agent "
        "passes its own environment on to vLLM (service/agent/boot.py), so the node may set it; the harness runs "
        "without it. Refused where the plan's env turns it off"
    ),
}


def render_docs(reports: list[dict]) -> str:
    lines = [
        "# Agreement with vLLM's own configuration code",
        "",
        "Generated by `make differential` (scripts/vllm_differential.py); do not edit by hand. Each launch is drawn",
        "by a seeded generator (fixture models × GPUs × parallel sizes × dtype × quantization × KV-cache dtype ×",
        "lengths × 0–4 further options from the release's whole option table) and judged twice: by the release's own",
        "`vllm serve` parser, serve-level checks and `EngineArgs.create_engine_config()` (the platform answering as",
        "the launch's GPU, no GPU used), and by Preflight's `validate()`.",
        "",
        "- **both ways**: the share of launches where the two agree (an accept by vLLM's config code beside a",
        "  Preflight refusal for memory or per-rank shapes, which that code cannot see, counts as agreement);",
        "- **vLLM accepts → Preflight accepts**: one minus the false-reject rate (the costly error);",
        "- **vLLM refuses → Preflight refuses for a configuration reason**: refusals only for memory are misses here.",
        "- `harness`: launches the environment could not judge (not counted);",
        "- `policy`: launches vLLM accepts that Preflight refuses only by its loading policy (a write path such as a",
        "  profiler directory, a secret as an argument, code loaded on the node: service/domain/loading.py), which vLLM",
        "  does not have (not counted; listed so that no such refusal hides among the false rejects).",
        "",
        "Only the lines with a row below have been measured; the others are judged by Preflight without this figure.",
        "",
        "| vLLM | n | judged | both ways | vLLM accepts → Preflight accepts | vLLM refuses → Preflight refuses | false rejects | missed | memory only | beyond config | harness | policy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        c, a = r["counts"], r["agreement"]
        pct = lambda x: "—" if x is None else f"{100 * x:.1f} %"  # noqa: E731
        lines.append(
            f"| {r['vllm_version']} | {r['n']} | {r['judged']} | {pct(a['both_ways'])} | "
            f"{pct(a['vllm_accepts_preflight_accepts'])} | {pct(a['vllm_refuses_preflight_refuses'])} | "
            f"{c.get('false_reject', 0)} | {c.get('missed_reject', 0)} | {c.get('memory_only', 0)} | "
            f"{c.get('beyond_config', 0)} | {c.get('harness', 0)} | {c.get('policy', 0)} |"
        )
    for r in reports:
        lines += ["", f"## vLLM {r['vllm_version']} (seed {r['seed']}, {r['seconds']} s)", ""]
        fam = r.get("families", {})
        if fam:
            lines += ["| Preflight rule | refused with vLLM | refused, vLLM accepts |", "|---|---|---|"]
            lines += [f"| `{k}` | {v.get('agree_reject', 0)} | {v.get('false_reject', 0)} |" for k, v in fam.items()]
        for kind, title in (
            ("false_reject", "False rejects, by rule"),
            ("missed_reject", "Missed refusals, by vLLM's message"),
            ("memory_only", "Refused only for memory, by vLLM's message"),
            ("harness", "Not judged (environment)"),
            ("policy", "Refused by Preflight's loading policy only, by rule"),
        ):
            found = r["causes"].get(kind)
            if found:
                lines += ["", f"**{title}**", ""]
                lines += [
                    f"- {count} × {text}" + (f" — {KNOWN[text]}" if text in KNOWN else "")
                    for text, count in list(found.items())[:25]
                ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--vllm",
        action="append",
        help="release to judge against, optionally with its own n: 0.10.2:500 (default 0.33.0)",
    )
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("/tmp/preflight-differential"))
    ap.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/preflight-vllm-gen"))
    ap.add_argument("--torch", default=HARNESS_TORCH)
    ap.add_argument("--jobs", type=int, default=2, help="vLLM processes at once (one per GPU model)")
    ap.add_argument("--docs", action="store_true", help="write docs/differential.md (and docs/differential/*.json)")
    args = ap.parse_args(argv)
    reports = []
    for spec in args.vllm or ["0.33.0"]:
        version, _, count = spec.partition(":")
        report = run(version, int(count or args.n), args.seed, args.out / version, args.work, args.torch, args.jobs)
        print(json.dumps({k: report[k] for k in ("vllm_version", "n", "judged", "counts", "agreement")}), flush=True)
        reports.append(report)
    if args.docs:
        data = ROOT / "docs" / "differential"
        data.mkdir(exist_ok=True)
        for r in reports:
            (data / f"{r['vllm_version']}.json").write_text(json.dumps(r, indent=1) + "\n")
        every = [json.loads(p.read_text()) for p in sorted(data.glob("*.json"))]
        DOCS.write_text(render_docs(sorted(every, key=lambda r: [int(x) for x in r["vllm_version"].split(".")])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
