"""service/data/vllm/checks/check_lines.json (scripts/vllm_check_lines.py): which release lines make each vLLM start-up
check. The data must name real rules and supported lines, and the rules gated on it must refuse on 0.10.2 what
vLLM 0.10.2 refuses (each case's file:line is where the 0.10.2 wheel raises it)."""

from __future__ import annotations

import pytest

from service.domain.rules import RULES
from service.domain.rules.gating import check_lines
from service.domain.versions import version_lines
from tests.support import request
from tests.support.rules import errors

DATA = check_lines()
CHECKS = DATA["checks"]
LINES = {line.newest for line in version_lines()}


def test_names_real_rules_and_supported_lines() -> None:
    codes = {code for info in RULES for code in info.codes}
    assert DATA["generator"] == "scripts/vllm_check_lines.py"
    assert set(DATA["wheels"]) == LINES
    assert all(len(w["sha256"]) == 64 for w in DATA["wheels"].values())
    for name, check in CHECKS.items():
        assert check["rule"] in codes, name
        assert set(check["lines"]) | set(check["off"]) | set(check["found"]) <= LINES, name
        assert set(check["lines"]) <= set(check["found"]), name  # a line makes a check only where its source has it
        assert not set(check["lines"]) & set(check["off"]), name


def test_every_gate_names_a_check() -> None:
    """Every ``vllm_checks(ctx, "…")`` in the rules names a check the data holds (else it would raise KeyError)."""
    import pathlib
    import re

    rules = pathlib.Path(__file__).resolve().parents[2] / "service" / "domain" / "rules"
    used = {m for p in rules.glob("*.py") for m in re.findall(r'vllm_checks\(ctx, "(\w+)"\)', p.read_text())}
    assert used and used <= set(CHECKS)


@pytest.mark.parametrize(
    ("check", "at"),
    [
        ("nsight_requires_ray", "vllm/config/parallel.py:442-444"),
        ("dp_hybrid_needs_local", "vllm/engine/arg_utils.py:1252-1254"),
        ("eplb_redundant_needs_eplb", "vllm/config/parallel.py:369-374"),
        ("spec_tokens_without_model_by_type", "vllm/config/__init__.py:2064-2065"),
        ("structured_output_whitespace", "vllm/config/__init__.py:3016-3019"),
        ("structured_output_additional_properties", "vllm/config/__init__.py:3020-3022"),
        ("long_partial_prefills_bounds", "vllm/config/scheduler.py:296-302"),
        ("batched_tokens_at_least_max_num_seqs", "vllm/config/scheduler.py:262-266"),
    ],
)
def test_0_10_2_places(check: str, at: str) -> None:
    assert "0.10.2" in CHECKS[check]["lines"]
    assert [f["at"] for f in CHECKS[check]["found"]["0.10.2"]] == [at]


def _on(version: str, model: str = "meta-llama__Meta-Llama-3.1-8B", **args: object) -> dict:
    req = request(model, **args)
    req["vllm_version"] = version
    return req


def test_nsight_without_ray_refused_on_0_10_2() -> None:
    found = errors(_on("0.10.2", ray_workers_use_nsight=True), "nsight_requires_ray")
    assert [f.message.split(" (")[0] for f in found] == ["Unable to use nsight profiling unless workers run with Ray."]
    assert not errors(
        _on("0.10.2", ray_workers_use_nsight=True, distributed_executor_backend="ray"), "nsight_requires_ray"
    )


def test_nsight_beyond_one_node_defaults_to_ray_up_to_0_10() -> None:
    """0.10.2 makes Ray the backend when the world size exceeds the node's GPUs (parallel.py:384-392): no refusal;
    0.11.2 refuses such a world size itself, and nsight without Ray with it."""
    beyond = {"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "ray_workers_use_nsight": True}
    assert not errors(_on("0.10.2", **beyond, nodes=2), "nsight_requires_ray")
    assert errors(_on("0.11.2", **beyond, nodes=2), "nsight_requires_ray")


def test_hybrid_lb_without_local_size_refused_on_0_10_2() -> None:
    req = _on("0.10.2", "Qwen__Qwen3-30B-A3B", data_parallel_size=4, data_parallel_hybrid_lb=True)
    assert [f.message for f in errors(req, "dp_lb_mode")] == [
        "data_parallel_size_local must be set to use data_parallel_hybrid_lb."
    ]


def test_redundant_experts_without_eplb_refused_on_0_10_2() -> None:
    req = _on("0.10.2", "Qwen__Qwen3-30B-A3B", eplb_config={"num_redundant_experts": 2})
    assert [f.message for f in errors(req, "eplb_options")] == [
        "num_redundant_experts is set to 2 but EPLB is not enabled. Either enable EPLB or unset num_redundant_experts."
    ]
    assert errors(_on("0.10.2", "Qwen__Qwen3-30B-A3B", num_redundant_experts=2), "eplb_options")


def test_spec_tokens_without_model_refused_on_0_10_2() -> None:
    req = _on("0.10.2", speculative_config={"method": "eagle", "num_speculative_tokens": 3})
    found = errors(req, "spec_model_missing")
    assert [f.message.split(" (")[0] for f in found] == [
        "num_speculative_tokens was provided without speculative model."
    ]
    # 0.10.2 takes DeepSeek-V3's own weights as the draft (config/__init__.py:2047-2056): not refused there
    deepseek = _on("0.10.2", "deepseek-ai__DeepSeek-V3", speculative_config={"num_speculative_tokens": 1})
    assert not errors(deepseek, "spec_model_missing")


def test_guided_decoding_options_refused_on_0_10_2() -> None:
    space = errors(_on("0.10.2", guided_decoding_disable_any_whitespace=True), "structured_output_options")
    assert [f.message for f in space] == [
        "disable_any_whitespace is only supported for xgrammar and guidance backends."
    ]
    extra = _on("0.10.2", guided_decoding_backend="xgrammar", guided_decoding_disable_additional_properties=True)
    assert [f.message for f in errors(extra, "structured_output_options")] == [
        "disable_additional_properties is only supported for the guidance backend."
    ]
    ok = _on("0.10.2", guided_decoding_backend="guidance", guided_decoding_disable_any_whitespace=True)
    assert not errors(ok, "structured_output_options")
    # 0.11.2 forwards the deprecated options after the config's check (arg_utils.py:1720-1732): not refused
    assert not errors(_on("0.11.2", guided_decoding_disable_any_whitespace="true"), "structured_output_options")
    json_opts = _on("0.13.0", structured_outputs_config={"disable_any_whitespace": True})
    assert errors(json_opts, "structured_output_options")


def test_long_partial_prefills_bounds_on_0_10_2() -> None:
    req = _on("0.10.2", max_num_partial_prefills=2, max_long_partial_prefills=3)
    assert [f.message for f in errors(req, "partial_prefill_bounds")] == [
        "max_long_partial_prefills (3) must be greater than or equal to 1 and less than or equal to "
        "max_num_partial_prefills (2)."
    ]
    assert not errors(_on("0.10.2", max_num_partial_prefills=2, max_long_partial_prefills=2), "partial_prefill_bounds")
    assert not errors(_on("0.28.0", max_long_partial_prefills=3), "partial_prefill_bounds")


def test_batched_tokens_below_max_num_seqs_on_0_10_2() -> None:
    """Llama-3.1-405B on one H100 with --max-num-batched-tokens 2: given max_num_seqs 128, 0.10.2 refuses
    (config/scheduler.py:262-266). Left to its default, ``vllm serve`` caps max_num_seqs at max_num_batched_tokens
    (0.10.2 arg_utils.py:1740-1743, usage context OPENAI_API_SERVER): 2 ≥ 2, no refusal."""
    big = "meta-llama__Meta-Llama-3.1-405B"
    given = _on("0.10.2", big, count=1, max_num_batched_tokens=2, max_num_seqs=128)
    assert [f.message.split(". (")[0] for f in errors(given, "batched_tokens_lt_max_num_seqs")] == [
        "max_num_batched_tokens (2) must be greater than or equal to max_num_seqs (128)"
    ]
    assert not errors(_on("0.10.2", big, count=1, max_num_batched_tokens=2), "batched_tokens_lt_max_num_seqs")


def test_dcp_a2a_without_dcp_refused_where_the_release_checks() -> None:
    """vLLM 0.24.0 config/parallel.py:509-512: ``--dcp-comm-backend a2a`` with DCP 1 is refused; with DCP 2 (TP 2)
    it passes; a line without the check is not judged."""
    lines = CHECKS["dcp_a2a_needs_dcp"]["lines"]
    assert "0.24.0" in lines
    found = errors(_on("0.24.0", dcp_comm_backend="a2a"), "dcp_comm_backend")
    assert [f.message.split(" (")[0] for f in found] == [
        "dcp_comm_backend='a2a' requires decode_context_parallel_size > 1."
    ]
    ok = _on("0.24.0", "Qwen__Qwen3-8B", tensor_parallel_size=2, decode_context_parallel_size=2, dcp_comm_backend="a2a")
    assert not errors(ok, "dcp_comm_backend")
    assert not errors(_on("0.24.0", dcp_comm_backend="ag_rs"), "dcp_comm_backend")


NANO = "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"


def test_mamba_align_needs_chunked_prefill_on_0_24() -> None:
    """vLLM 0.24.0 model_executor/models/config.py:438-441 asserts chunked prefill in the 'align' Mamba cache mode,
    reached only with prefix caching on (off by default for a hybrid model there, config/model.py:1832-1836)."""
    assert "0.24.0" in CHECKS["mamba_align_needs_chunked_prefill"]["lines"]
    off = {"enable_chunked_prefill": False, "enable_prefix_caching": True}
    found = errors(_on("0.24.0", NANO, mamba_cache_mode="align", **off), "mamba_prefix_caching_chunked_prefill")
    assert [f.message.split(" (")[0] for f in found] == [
        "AssertionError: Chunked prefill is required for mamba cache mode 'align'."
    ]
    # prefix caching left to 0.24's default (off for hybrids), or 'all' left to the model's support: not refused
    assert not errors(
        _on("0.24.0", NANO, mamba_cache_mode="align", enable_chunked_prefill=False),
        "mamba_prefix_caching_chunked_prefill",
    )
    assert not errors(_on("0.24.0", NANO, **off), "mamba_prefix_caching_chunked_prefill")
    assert not errors(_on("0.24.0", mamba_cache_mode="align", **off), "mamba_prefix_caching_chunked_prefill")


def test_cudagraph_capture_size_below_one_refused_with_cuda_graphs_on() -> None:
    """vllm 0.24.0 config/vllm.py:1677-1699: with CUDA graphs on, min(max_cudagraph_capture_size,
    max_num_batched_tokens) must be at least 1; eager mode (or settings that may turn graphs off) is not judged."""
    assert {"0.13.0", "0.24.0", "0.33.0"} <= set(CHECKS["cudagraph_max_size_positive"]["lines"])
    for size in (0, -1):
        found = errors(_on("0.24.0", max_cudagraph_capture_size=size), "cudagraph_capture_size")
        assert [f.message.split(" (")[0] for f in found] == [
            "AssertionError: Maximum cudagraph size should be greater than or equal to 1 when using cuda graph."
        ]
    assert not errors(_on("0.24.0", max_cudagraph_capture_size=0, enforce_eager=True), "cudagraph_capture_size")
    assert not errors(_on("0.24.0", max_cudagraph_capture_size=0, optimization_level=0), "cudagraph_capture_size")
    assert not errors(_on("0.24.0", max_cudagraph_capture_size=8), "cudagraph_capture_size")


def test_shm_object_size_needs_the_shm_processor_cache_on_a_multimodal_model() -> None:
    """vllm 0.24.0 config/multimodal.py:245-256, built only for a multimodal model (Llama 4 Scout here)."""
    scout = "meta-llama__Llama-4-Scout-17B-16E-Instruct"
    found = errors(_on("0.24.0", scout, mm_shm_cache_max_object_size_mb=4), "mm_cache_options")
    assert [f.message.split(" (")[0] for f in found] == [
        "'mm_shm_cache_max_object_size_mb' should only be set when 'mm_processor_cache_type' is 'shm'."
    ]
    shm = _on("0.24.0", scout, mm_shm_cache_max_object_size_mb=4, mm_processor_cache_type="shm")
    assert not errors(shm, "mm_cache_options")
    assert not errors(_on("0.24.0", scout, mm_shm_cache_max_object_size_mb=128), "mm_cache_options")  # the default
    assert not errors(_on("0.24.0", mm_shm_cache_max_object_size_mb=4), "mm_cache_options")  # a text-only model


def test_attention_backend_auto_selects_only_where_the_release_maps_it() -> None:
    """From 0.18 config/attention.py reads "auto" as None (automatic selection); vLLM 0.13.0 looks AUTO up in
    AttentionBackendEnum (attention/backends/registry.py:24-31) and refuses it."""
    assert "0.18.1" in CHECKS["attention_backend_auto_selects"]["lines"]
    assert "0.13.0" not in CHECKS["attention_backend_auto_selects"]["found"]
    (f,) = errors(_on("0.13.0", attention_backend="auto"), "backend_unknown")
    assert f.message.startswith("Unknown attention backend: 'AUTO'. Valid options are: FLASH_ATTN,")
    assert not errors(_on("0.24.0", attention_backend="auto"), "backend_unknown")
    assert not errors(_on("0.13.0", attention_backend="flash_attn"), "backend_unknown")


def test_kv_offloading_backend_needs_a_size_on_0_13() -> None:
    """vllm 0.13.0 config/vllm.py:484-487."""
    assert CHECKS["kv_offloading_needs_size"]["lines"] == ["0.11.2", "0.13.0"]
    (f,) = errors(_on("0.13.0", kv_offloading_backend="lmcache"), "kv_offloading_options")
    assert f.message == "You must set kv_offloading_size when kv_offloading_backend is set."
    assert not errors(_on("0.13.0", kv_offloading_backend="native", kv_offloading_size=4), "kv_offloading_options")


def test_hc_sp_needs_a_model_class_that_supports_it() -> None:
    """vllm 0.33.0 config/model.py:1546-1556: with TP > 1, --enable-hc-sp asks the registry's supports_hc_sp (the
    SupportsHCSP interface, which no 0.33 model class implements); TP 1 is not checked."""
    assert "0.33.0" in CHECKS["hc_sp_model_support"]["lines"]
    qwen = "Qwen__Qwen2.5-72B-Instruct"
    found = errors(_on("0.33.0", qwen, tensor_parallel_size=8, enable_hc_sp=True), "hc_sp_options")
    assert [f.message.split(" (")[0] for f in found] == ["--enable-hc-sp is not supported for this model"]
    assert not errors(_on("0.33.0", enable_hc_sp=True), "hc_sp_options")


def test_kda_fused_prefill_is_rocm_only() -> None:
    """vllm 0.33.0 engine/arg_utils.py:2868-2880."""
    (f,) = errors(_on("0.33.0", kda_prefill_backend="fused"), "kda_prefill_backend")
    assert f.message.startswith("--kda-prefill-backend=fused is only available on ROCm.")
    assert not errors(_on("0.33.0", kda_prefill_backend="flashkda"), "kda_prefill_backend")


def test_routed_experts_asked_through_the_aux_output_config() -> None:
    """vllm 0.33.0 config/vllm.py:1187-1206: AuxOutputConfig.enabled is enable_return_routed_experts, from the flag
    or the JSON option alike; a dense model is refused either way."""
    env = {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    req = _on("0.33.0", "Qwen__Qwen3-8B", aux_output_config={"enable_return_routed_experts": 1})
    req["env"] = env
    assert "AuxOutput Connector only supports MoE models." in [
        f.message.split(" (")[0] for f in errors(req, "routed_experts")
    ]


def test_no_false_reject_where_vllm_turns_the_checked_path_off() -> None:
    """A bitsandbytes checkpoint may force eager mode (vllm 0.24.0 config/model.py:1090-1110), so CUDA graph sizes
    are not checked; a watermark runs Model Runner V2 whatever VLLM_USE_V2_MODEL_RUNNER says (0.33.0
    config/vllm.py:740-746)."""
    bnb = _on("0.24.0", max_cudagraph_capture_size=0)
    bnb["model"]["config"] = {
        **bnb["model"]["config"],
        "quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True},
    }
    assert not errors(bnb, "cudagraph_capture_size")
    req = _on("0.33.0", "Qwen__Qwen3-30B-A3B", enable_return_routed_experts=True, watermark_config={"key": 1})
    req["env"] = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert not [f for f in errors(req, "routed_experts") if "Model Runner V2" in f.message]
