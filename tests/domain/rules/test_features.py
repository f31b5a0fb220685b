"""The feature rules (service/domain/rules/features.py): routed experts on MoE models only, Mamba cache options
vLLM refuses in combination, ROCm-only attention backends on NVIDIA GPUs."""

from __future__ import annotations

from tests.support import request
from tests.support.rules import errors

LLAMA = "meta-llama__Llama-3.1-8B-Instruct"
QWEN_MOE = "Qwen__Qwen3-30B-A3B"
NEMOTRON_H = "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"  # hybrid Mamba / attention / MoE


def test_routed_experts_need_moe():
    (f,) = errors(request(LLAMA, count=1, enable_return_routed_experts=True), "routed_experts")
    assert f.message.startswith("AuxOutput Connector only supports MoE models.")
    assert f.remedy == {"enable_return_routed_experts": False}
    assert not errors(request(QWEN_MOE, count=1, enable_return_routed_experts=True), "routed_experts")


def test_routed_experts_need_prefix_caching_and_no_pp():
    req = request(
        QWEN_MOE, count=2, enable_return_routed_experts=True, enable_prefix_caching=False, pipeline_parallel_size=2
    )
    assert [f.remedy for f in errors(req, "routed_experts")] == [
        {"enable_prefix_caching": True},
        {"pipeline_parallel_size": 1},
    ]
    old = request(LLAMA, count=1, enable_return_routed_experts=True)
    old["vllm_version"] = "0.30.0"  # the option existed; the MoE check came with the AuxOutput connector (0.32)
    assert not errors(old, "routed_experts")


def test_replayssm_needs_recurrent_layers():
    (f,) = errors(request(LLAMA, count=1, use_replayssm=True), "mamba_options")
    assert f.message == "--use-replayssm is not supported for architecture 'LlamaForCausalLM'"
    ok = request(
        NEMOTRON_H, gpu="h200-141gb", count=2, tensor_parallel_size=2, trust_remote_code=True, use_replayssm=True
    )
    assert not errors(ok, "mamba_options")


def test_mamba_block_size_needs_prefix_caching():
    base = {
        "gpu": "h200-141gb",
        "count": 2,
        "tensor_parallel_size": 2,
        "trust_remote_code": True,
        "mamba_block_size": 256,
    }
    (f,) = errors(request(NEMOTRON_H, enable_prefix_caching=False, **base), "mamba_options")
    assert f.message == "--mamba-block-size can only be set with --enable-prefix-caching"
    assert not errors(request(NEMOTRON_H, **base), "mamba_options")


def test_stochastic_rounding_needs_float16_ssm_cache():
    base = {"gpu": "h200-141gb", "count": 2, "tensor_parallel_size": 2, "trust_remote_code": True}
    (f,) = errors(request(NEMOTRON_H, enable_mamba_cache_stochastic_rounding=True, **base), "mamba_options")
    assert f.remedy == {"mamba_ssm_cache_dtype": "float16"}
    ok = request(NEMOTRON_H, enable_mamba_cache_stochastic_rounding=True, mamba_ssm_cache_dtype="float16", **base)
    assert not errors(ok, "mamba_options")


def test_mamba_options_on_a_transformer_are_ignored():
    assert not errors(
        request(LLAMA, count=1, mamba_ssm_cache_dtype="float32", mamba_cache_dtype="float32"), "mamba_options"
    )


def test_rocm_only_backend_on_nvidia():
    (f,) = errors(request(LLAMA, count=1, attention_backend="ROCM_SEGMENTED_ATTN"), "attention_backend_platform")
    assert "ROCM_SEGMENTED_ATTN requires AMD RDNA GPUs on ROCm" in f.message
    assert not errors(
        request(LLAMA, gpu="mi300x-192gb", count=1, attention_backend="ROCM_OCTAVE"), "attention_backend_platform"
    )
    assert not errors(request(LLAMA, count=1, attention_backend="FLASHINFER"), "attention_backend_platform")


def test_batch_sharded_sampling_blockers():
    (f,) = errors(request(LLAMA, count=1, enable_batch_sharded_sampling=True), "batch_sharded_sampling")
    assert f.message.endswith("reason(s): tensor_parallel_size is 1, so there is nothing to shard.")
    req = request(
        LLAMA, count=2, tensor_parallel_size=2, max_num_seqs=1, max_logprobs=-1, enable_batch_sharded_sampling=True
    )
    (f,) = errors(req, "batch_sharded_sampling")
    assert "max_num_seqs (1) is below tensor_parallel_size (2); max_logprobs is -1" in f.message
    assert not errors(
        request(LLAMA, count=2, tensor_parallel_size=2, enable_batch_sharded_sampling=True), "batch_sharded_sampling"
    )


def test_offload_options():
    (f,) = errors(request(LLAMA, count=1, offload_group_size=2, offload_num_in_group=3), "offload_options")
    assert f.message == "offload_num_in_group (3) must be <= offload_group_size (2)"
    (f,) = errors(request(LLAMA, count=1, offload_backend="prefetch"), "offload_options")
    assert f.message == "offload_num_in_group (1) must be <= offload_group_size (0)"
    (f,) = errors(request(LLAMA, count=1, offload_group_size=4, offload_prefetch_step=0), "offload_options")
    assert f.message.startswith("offload_prefetch_step (0) must be >= 1")
    assert not errors(request(LLAMA, count=1, offload_group_size=4, offload_num_in_group=2), "offload_options")
    assert not errors(request(LLAMA, count=1, offload_num_in_group=3), "offload_options")  # no prefetch offloading


def test_model_specific_options():
    (f,) = errors(request(QWEN_MOE, count=1, moe_backend="flashinfer_moe_ep_mega_deep_gemm"), "model_specific_option")
    assert f.message.startswith("moe_backend='flashinfer_moe_ep_mega_deep_gemm' is only supported for DeepSeek-V4")
    v4 = request("deepseek-ai__DeepSeek-V4-Pro", gpu="b200-180gb", count=8, tensor_parallel_size=8,
                 moe_backend="flashinfer_moe_ep_mega_deep_gemm")  # fmt: skip
    assert not errors(v4, "model_specific_option")
    (f,) = errors(request(LLAMA, count=1, engram_config={}), "model_specific_option")
    assert f.message.startswith("EngramConfig requires a model with supported Engram embeddings")


def _at(version: str, model: str = LLAMA, env: dict | None = None, **args) -> dict:
    req = request(model, count=1, **args)
    req["vllm_version"] = version
    if env:
        req["env"] = env
    return req


DRAFT = {"method": "draft_model", "model": "meta-llama/Llama-3.2-1B", "num_speculative_tokens": 3}


def test_logits_processor_pattern_refused_from_011_to_015():
    for version in ("0.11.2", "0.13.0", "0.15.1"):
        (f,) = errors(_at(version, logits_processor_pattern="foo"), "feature_unsupported")
        assert f.message == (
            "--logits-processor-pattern is not supported. We recommend to remove --logits-processor-pattern from "
            "your config."
        )
        assert f.remedy == {"drop": ["logits_processor_pattern"]}
        assert f.field == "engine_args.logits_processor_pattern"
    # '' and 'None' parse to None, vLLM's default: nothing to refuse
    assert not errors(_at("0.13.0", logits_processor_pattern="None"), "feature_unsupported")
    # 0.10.2 falls back to the V0 engine unless VLLM_USE_V1=1
    assert not errors(_at("0.10.2", logits_processor_pattern="foo"), "feature_unsupported")
    (f,) = errors(_at("0.10.2", env={"VLLM_USE_V1": "1"}, logits_processor_pattern="foo"), "feature_unsupported")
    assert f.message == "VLLM_USE_V1=1 is not supported with --logits-processor-pattern."


def test_concurrent_partial_prefill_refused_from_011_to_026():
    text = "Concurrent Partial Prefill is not supported. We recommend to remove Concurrent Partial Prefill from your config."
    for version in ("0.11.2", "0.13.0", "0.15.1", "0.18.1", "0.21.0", "0.24.0", "0.26.0"):
        (f,) = errors(_at(version, max_num_partial_prefills=2), "feature_unsupported")
        assert (f.message, f.remedy) == (text, {"max_num_partial_prefills": 1})
        (f,) = errors(_at(version, max_long_partial_prefills="3"), "feature_unsupported")
        assert f.remedy == {"max_long_partial_prefills": 1}
        # SchedulerConfig's default (1) set explicitly is no difference
        assert not errors(_at(version, max_num_partial_prefills=1, max_long_partial_prefills=1), "feature_unsupported")


def test_draft_model_refused_on_010_to_013():
    for version in ("0.11.2", "0.13.0"):
        (f,) = errors(_at(version, speculative_config=DRAFT), "feature_unsupported")
        assert f.message.startswith("Draft model speculative decoding is not supported yet.")
        assert f.remedy == {"drop": ["speculative_config"]}
    assert not errors(_at("0.15.1", speculative_config=DRAFT), "feature_unsupported")
    (f,) = errors(_at("0.10.2", speculative_config=DRAFT), "feature_unsupported")
    assert f.message.startswith("Speculative decoding with draft model is not supported yet.")
    # the V0 engine takes the launch: VLLM_USE_V1=0, or an earlier oracle row falls back first
    assert not errors(_at("0.10.2", env={"VLLM_USE_V1": "0"}, speculative_config=DRAFT), "feature_unsupported")
    assert not errors(_at("0.10.2", speculative_config=DRAFT, preemption_mode="swap"), "feature_unsupported")
    assert not errors(_at("0.10.2", speculative_config=DRAFT, kv_cache_dtype="fp8"), "feature_unsupported")


def test_v1_oracle_rows_need_vllm_use_v1():
    v1 = {"VLLM_USE_V1": "1"}
    (f,) = errors(_at("0.9.2", env=v1, num_scheduler_steps=4), "feature_unsupported")
    assert (f.message, f.remedy) == (
        "VLLM_USE_V1=1 is not supported with --num-scheduler-steps.",
        {"num_scheduler_steps": 1},
    )
    (f,) = errors(_at("0.8.5", env=v1, scheduler_delay_factor=0.5), "feature_unsupported")
    assert f.remedy == {"scheduler_delay_factor": 0.0}
    assert not errors(_at("0.8.5", scheduler_delay_factor=0.5), "feature_unsupported")
    assert not errors(_at("0.8.5", env=v1, scheduler_delay_factor=0.0), "feature_unsupported")
    # 0.9 runs ngram on V1; a draft model (no method) is refused
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    assert not errors(_at("0.9.2", env=v1, speculative_config=ngram), "feature_unsupported")
    draft = {"model": "meta-llama/Llama-3.2-1B", "num_speculative_tokens": 3}
    (f,) = errors(_at("0.9.2", env=v1, speculative_config=draft), "feature_unsupported")
    assert f.message == "VLLM_USE_V1=1 is not supported with Speculative Decoding."
    # releases before the oracle, and from 0.28 on, check none of these
    assert not errors(_at("0.7.3", env=v1, scheduler_delay_factor=0.5), "feature_unsupported")


def test_pooler_config_without_pooling_type_on_013():
    (f,) = errors(_at("0.13.0", pooler_config={"normalize": True}), "pooler_config_generate")
    assert f.message.startswith("'NoneType' object has no attribute 'lower'")
    assert f.remedy == {"drop": ["pooler_config"]}
    assert not errors(_at("0.13.0", pooler_config={"pooling_type": "LAST"}), "pooler_config_generate")
    assert not errors(_at("0.15.1", pooler_config={"normalize": True}), "pooler_config_generate")
    assert not errors(_at("0.11.2", pooler_config={"normalize": True}), "pooler_config_generate")
    # a hybrid model takes the 'hybrid' attention branch, which reads no pooling type
    hybrid = _at("0.13.0", NEMOTRON_H, pooler_config={"normalize": True}, trust_remote_code=True)
    assert not errors(hybrid, "pooler_config_generate")
