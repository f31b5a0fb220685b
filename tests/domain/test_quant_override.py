"""service/domain/quant_override.py against each release itself: tests/fixtures/vllm_quant_overrides/<release>.json
holds the verdicts the release's own ModelConfig._verify_quantization gave (scripts/vllm_quant_overrides_inside.py)
for a grid of checkpoint quantization configs × model types × GPUs × every ``--quantization`` value; Preflight's
predicates must give the same method, the same refusal, for every cell. Beside it, the generated override facts
must name only config classes and code Preflight has read."""

from __future__ import annotations

import json
import pathlib

import pytest

from service.domain.gpus import Gpu, resolve
from service.domain.model_facts import read_quant_config
from service.domain.quant_override import PREDICATES, override_facts, reconcile
from service.domain.versions import DATA_DIR, resolve_version, version_lines
from tests.support import CASES, MODELS, hf_quant_config, load_case, model_config

GRIDS = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "vllm_quant_overrides"
VERSIONS = sorted(p.stem for p in GRIDS.glob("*.json"))


def gpu_of(label: str) -> Gpu:
    """A GPU as the grid names it: ``cuda80`` (an NVIDIA part of capability 8.0) or ``rocm94`` (an AMD part)."""
    amd = label.startswith("rocm")
    cc = int(label[4:])
    return Gpu(
        id=label,
        name=label,
        vendor="AMD" if amd else "NVIDIA",
        compute_capability=None if amd else (cc // 10, cc % 10),
        memory_bytes=80 << 30,
        memory_source="test",
        bf16=True,
        fp8=True,
        nvlink=None,
    )


def expected(outcome: dict, user: str | None) -> tuple[str, str | None]:
    """("ok", method) / ("mismatch", None) / ("error", text) from a grid outcome."""
    if user is None:
        kind, _, rest = outcome["none"].partition(":")
        return (kind, rest) if kind == "ok" else ("error", rest.split(": ", 1)[1])
    if user in outcome["ok"]:
        return "ok", outcome["ok"][user]
    if user in outcome["error"]:
        return "error", outcome["error"][user].split(": ", 1)[1]
    return "mismatch", None


@pytest.mark.parametrize("version", VERSIONS)
def test_the_predicates_give_the_release_s_own_verdicts(version):
    grid = json.loads((GRIDS / f"{version}.json").read_text())
    facts = json.loads((DATA_DIR / "quant_overrides" / f"{version}.json").read_text())
    _, line = resolve_version(version)
    assert line.newest == version
    users = [None, *facts["quantization_methods"]]
    wrong = []
    for cell, index in grid["cells"].items():
        cid, model_type, label = cell.split("|")
        outcome, gpu = grid["outcomes"][index], gpu_of(label)
        for user in users:
            v = reconcile(grid["configs"][cid], user, model_type=model_type, gpu=gpu, line=line)
            kind, detail = expected(outcome, user)
            if kind == "ok":
                good = v.refusal is None and v.method == detail
            elif kind == "mismatch":
                good = v.mismatch
            elif detail.startswith("Unknown quantization method: "):  # after the loop: quant_unknown's part
                good = v.refusal is None and v.method == detail.split(": ")[1].rstrip(".")
            else:
                good = v.refusal == detail
            if not good:
                wrong.append(f"{cell} user={user}: vLLM {kind} {detail}, Preflight {v}")
    assert wrong == [], f"{len(wrong)} cells differ, e.g.\n" + "\n".join(wrong[:20])


def test_every_line_has_its_override_facts_and_each_override_has_been_read():
    for line in version_lines():
        facts = override_facts(line.newest)
        assert facts is not None, f"service/data/vllm/quant_overrides/{line.newest}.json missing"
        generated = json.loads((DATA_DIR / "quant_overrides" / f"{line.newest}.json").read_text())["source"]
        grid = json.loads((GRIDS / f"{line.newest}.json").read_text())["source"]
        assert generated["sha256"] == grid["sha256"] == line.source["sha256"], line.newest  # the catalogue's wheel
        for name, site in facts.methods.items():
            assert site.cls in PREDICATES, f"{line.newest} {name}: {site.cls} ({site.at}) has no predicate"
            assert site.code in PREDICATES[site.cls][1], (
                f"{line.newest} {name}: {site.cls}.override_quantization_method at {site.at} changed "
                f"(code {site.code}): read it and its predicate again"
            )


def test_the_order_is_the_release_s_own():
    facts = override_facts("0.33.0")
    assert facts is not None and facts.verify_at == "vllm/config/model.py:1383"
    overrides = [n for n in facts.order if n in facts.methods]
    assert overrides == [
        "auto_gptq",
        "gptq",
        "gptq_marlin",
        "auto_awq",
        "awq",
        "awq_marlin",
        "inc",
        "moe_wna16",
        "modelopt",
        "modelopt_fp4",
        "modelopt_mxfp8",
        "mxfp8",
        "modelopt_mixed",
        "gpt_oss_mxfp4",
        "deepseek_v4_fp8",
        "humming",
    ]  # vllm 0.33.0 vllm/config/model.py:1397-1415 (mxfp4 has no override of its own)
    assert facts.order_by_user["humming"][-1] == "humming"  # asked first among the overrides: :1417-1419
    old = override_facts("0.6.6")
    assert old is not None and [n for n in old.order if n in old.methods] == [
        "marlin",
        "gptq_marlin_24",
        "gptq_marlin",
        "awq_marlin",
        "ipex",
    ]  # vllm 0.6.6 vllm/config.py:562: QUANTIZATION_METHODS' own order


# -- one launch per override, on real checkpoint configs ------------------------------------------------------------

CKPTS = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "quant_checkpoints"
H100, A100, T4, V100, MI300X = (
    resolve(g) for g in ("h100-sxm-80gb", "a100-sxm4-80gb", "t4-16gb", "v100-32gb", "mi300x-192gb")
)


def checkpoint(name: str) -> tuple[dict, str | None]:
    """A real checkpoint's quantization config as _verify_quantization receives it, and its top-level model_type:
    tests/fixtures/models/<name>, tests/fixtures/quant_checkpoints/<name> or a handed case's inline config."""
    if (CKPTS / name).is_dir():
        config = json.loads((CKPTS / name / "config.json").read_text())
        hf = None
    elif (MODELS / name).is_dir():
        config, hf = model_config(name), hf_quant_config(name)
    else:
        config, hf = load_case(CASES / "handed" / f"{name}.json")["model"]["config"], None
    q = read_quant_config(config, hf)
    assert q is not None
    return {**q.raw, "quant_method": q.method}, config.get("model_type")


def ask(name: str, user: str | None, version: str = "0.33.0", gpu: Gpu = H100):
    cfg, model_type = checkpoint(name)
    return reconcile(cfg, user, model_type=model_type, gpu=gpu, line=resolve_version(version)[1])


QWEN15_AWQ = "qcap-awq-v100-qwen15-32b"  # Qwen1.5-32B-Chat-AWQ: awq, 4 bits, group 128, zero point
GPTQ_ACT = "guide-gptq-desc-act"  # gptq, 4 bits, group 128, desc_act, sym
BAICHUAN_GPTQ = "quant-baichuan2-7b-gptq-tp4"  # gptq, 4 bits, group 128 (no sym / desc_act keys)


def test_modelopt_fp8_runs_modelopt_whatever_the_user_names():
    v = ask("nvidia__Llama-3.1-70B-Instruct-FP8", "awq")  # hf_quant_config.json: producer modelopt, quant_algo FP8
    assert (v.method, v.claimed_by, v.at, v.refusal) == (
        "modelopt",
        "modelopt",
        "vllm/model_executor/layers/quantization/modelopt.py:453",
        None,
    )
    assert ask("nvidia__Llama-3.1-70B-Instruct-FP8", "awq", "0.10.2").method == "modelopt"  # modelopt.py:96-121


def test_modelopt_nvfp4_mixed_precision_and_deepseek_v4_fp8():
    assert ask("nvidia__Kimi-K2.5-NVFP4", "fp8").method == "modelopt_fp4"  # modelopt.py:776-782
    mixed = ask("nvidia__DeepSeek-V4-Flash-NVFP4", "fp8")  # producer modelopt, MIXED_PRECISION, model deepseek_v4
    assert (mixed.method, mixed.claimed_by) == ("modelopt_mixed", "modelopt_mixed")  # asked before deepseek_v4_fp8
    v4 = ask("deepseek-ai__DeepSeek-V4-Flash", "fp8")  # fp8 block, model_type deepseek_v4
    assert (v4.method, v4.at) == ("deepseek_v4_fp8", "vllm/models/deepseek_v41/quant_config.py:164")
    assert ask("deepseek-ai__DeepSeek-V3", None).method == "fp8"  # deepseek_v3: not claimed
    assert ask("deepseek-ai__DeepSeek-V3", "deepseek_v4_fp8").method == "deepseek_v4_fp8"  # the user asks for it
    assert ask("deepseek-ai__DeepSeek-V4-Flash", None, "0.18.1").method == "fp8"  # no DeepSeek-V4 override yet


def test_petit_claims_modelopt_nvfp4_on_rocm_only():
    assert ask("nvidia__Kimi-K2.5-NVFP4", None, "0.18.1", MI300X).method == "petit_nvfp4"  # petit.py:135-145
    assert ask("nvidia__Kimi-K2.5-NVFP4", None, "0.18.1", H100).method == "modelopt_fp4"


def test_gpt_oss_mxfp4_and_humming():
    v = ask("openai__gpt-oss-120b", "mxfp4")
    assert (v.method, v.claimed_by) == ("gpt_oss_mxfp4", "gpt_oss_mxfp4")  # mxfp4.py:129-146
    h = ask("openai__gpt-oss-120b", "humming")  # humming.py:179-191 refuses gpt-oss MXFP4
    assert h.refusal == "For gpt-oss model, use '--moe-backend humming' instead of '--quantization humming'."
    assert ask("Qwen__Qwen3-235B-A22B-FP8", "humming").method == "humming"  # any other checkpoint
    assert ask("Qwen__Qwen3-235B-A22B-FP8", "humming", "0.18.1").mismatch  # no humming before 0.21


def test_awq_runs_auto_awq_and_marlin_where_the_release_had_it():
    assert ask(QWEN15_AWQ, "awq_marlin").method == "auto_awq"  # auto_awq.py:263-286
    gptq = ask(QWEN15_AWQ, "gptq")
    assert gptq.mismatch and "(awq) does not match" in gptq.refusal and gptq.refusal.endswith("(gptq).")
    assert ask(QWEN15_AWQ, None, "0.10.2", A100).method == "awq_marlin"  # awq_marlin.py:108-130
    assert ask(QWEN15_AWQ, None, "0.10.2", T4).method == "awq"  # Marlin needs 8.0 up to 0.13
    assert ask(QWEN15_AWQ, "awq_marlin", "0.10.2", T4).mismatch
    assert ask(QWEN15_AWQ, "awq_marlin", "0.18.1", T4).method == "awq_marlin"  # 7.5 from 0.15
    assert ask(QWEN15_AWQ, "awq", "0.10.2", A100).method == "awq"  # awq keeps the AWQ kernel


def test_gptq_runs_auto_gptq_and_marlin_where_its_keys_allow():
    assert ask(GPTQ_ACT, "gptq_marlin").method == "auto_gptq"  # auto_gptq.py:214-233
    assert ask(GPTQ_ACT, None, "0.10.2", A100).method == "gptq_marlin"  # gptq_marlin.py:163-185
    assert ask(BAICHUAN_GPTQ, None, "0.10.2", A100).method == "gptq"  # no sym / desc_act: not convertible
    assert ask(BAICHUAN_GPTQ, "gptq_marlin", "0.10.2", A100).mismatch


def test_moe_wna16_claims_awq_and_gptq_when_asked():
    assert ask(QWEN15_AWQ, "moe_wna16").method == "moe_wna16"  # moe_wna16.py:145-187
    assert ask(QWEN15_AWQ, "moe_wna16", gpu=V100).mismatch  # AWQ needs 7.5
    assert ask(GPTQ_ACT, "moe_wna16").mismatch  # desc_act with groups
    assert ask(BAICHUAN_GPTQ, "moe_wna16").method == "moe_wna16"


def test_compressed_tensors_and_gguf():
    kimi = ask("moonshotai__Kimi-K2.5", "awq")  # compressed-tensors: no override claims it
    assert kimi.mismatch and kimi.claimed_by is None
    assert ask("moonshotai__Kimi-K2.5", "compressed-tensors").method == "compressed-tensors"
    assert ask("deepseek-ai__DeepSeek-V3", "gguf", "0.21.0").method == "gguf"  # gguf.py:86-93
    assert ask("deepseek-ai__DeepSeek-V3", "gguf").mismatch  # gguf left core at 0.24


@pytest.mark.parametrize(
    ("version", "config", "user", "gpu", "method"),
    [
        ("0.33.0", "auto-round", None, "cuda90", "inc"),  # inc/inc.py:361-368
        ("0.33.0", "auto-round", "awq", "cuda90", "inc"),
        ("0.33.0", "modelopt-mxfp8", "fp8", "cuda90", "modelopt_mxfp8"),  # modelopt.py:1236-1242
        # 0.24 asks mxfp8 (ModelOptMxFp8Config too) among the non-overrides, and its guard refuses the claim
        # (vllm 0.24.0 vllm/config/model.py:983-1002, 1015-1033); 0.26 added mxfp8 to the overrides list
        ("0.24.0", "modelopt-mxfp8", "fp8", "cuda90", None),
        ("0.26.0", "modelopt-mxfp8", None, "cuda90", "modelopt_mxfp8"),
        ("0.9.2", "gptq-4-fmt-marlin", "gptq", "cuda80", "marlin"),  # marlin.py:94-110
        ("0.15.1", "gptq-4-fmt-marlin24", None, "cuda80", "gptq_marlin_24"),  # gptq_marlin_24.py:115-131
        ("0.15.1", "gptq-4-fmt-bitblas", "gptq", "cuda80", "bitblas"),  # bitblas.py:161-178
        ("0.15.1", "gptq-4-g128-sym", "gptq_bitblas", "cuda80", None),  # gptq_bitblas needs the bitblas package
        ("0.11.2", "gptq-4-g128-sym", None, "rocm94", "gptq"),  # ipex claims on CPU / XPU only
    ],
)
def test_the_other_overrides_on_the_release_s_own_grid(version, config, user, gpu, method):
    grid = json.loads((GRIDS / f"{version}.json").read_text())
    v = reconcile(grid["configs"][config], user, model_type="llama", gpu=gpu_of(gpu), line=resolve_version(version)[1])
    assert (v.method, v.refusal is None) == (method, method is not None)
