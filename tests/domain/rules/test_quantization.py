"""quant_unknown, quant_mismatch, quant_no_config and quant_fp8_online_deprecated (service/domain/rules/
quantization.py) on real checkpoints from tests/fixtures/models: for each code one launch that trips it (the code,
the figures of its message, its remedy) and one that does not. Registration of a manifest whose sources disagree
goes through the API (tests/services/test_manifests.py)."""

from __future__ import annotations

from service.domain.versions import resolve_version
from tests.support import request
from tests.support.rules import AWQ, found, quantized, run

QUANT_RULES = ("quant_unknown", "quant_mismatch", "quant_no_config", "quant_fp8_online_deprecated")
LINE = resolve_version("0.33.0")[1]
PLAIN = "meta-llama__Meta-Llama-3.1-70B"  # no quantization_config, no hf_quant_config.json
MODELOPT = "nvidia__Llama-3.1-70B-Instruct-FP8"  # hf_quant_config.json: ModelOpt FP8
QWEN_FP8 = "Qwen__Qwen3-235B-A22B-FP8"  # config.json quantization_config: fp8


def quant_findings(req: dict):
    return found(req, *QUANT_RULES)


def test_a_method_of_an_older_line_is_unknown_and_names_its_plugin():
    [f] = quant_findings(request("meta-llama__Meta-Llama-3.1-8B", quantization="bitsandbytes"))
    assert (f.rule, f.severity.value, f.field) == ("quant_unknown", "error", "engine_args.quantization")
    assert f.message.startswith("Unknown quantization method: bitsandbytes (--quantization). Must be one of ['awq',")
    assert "not in vLLM core since the 0.28.0 line" in f.message
    assert f.remedy == {"quantization": list(LINE.quant_methods), "plugin": "vllm-bnb-plugin (vllm-project/vllm#43529)"}
    assert quant_findings(request("meta-llama__Meta-Llama-3.1-8B", quantization="fp8_per_tensor")) == []


def test_a_modelopt_fp8_checkpoint_runs_modelopt_whatever_the_flag_names():
    """vLLM 0.33 asks ModelOptFp8Config.override_quantization_method before comparing the names (vllm 0.33.0
    vllm/config/model.py:1427-1449; modelopt.py:453-459): it claims an FP8 ModelOpt checkpoint for any value."""
    req = request(MODELOPT, quantization="awq", tensor_parallel_size=2, max_model_len=8192)
    assert quant_findings(req) == []
    result = run(req)
    assert result.argv[result.argv.index("--quantization") + 1] == "modelopt"  # the method vLLM runs
    assert quant_findings(request(MODELOPT, quantization="modelopt")) == []
    # replaced before vLLM's unknown-method check (vllm/config/model.py:1464-1469)
    assert quant_findings(request(MODELOPT, quantization="bitsandbytes")) == []


def test_an_awq_checkpoint_refuses_gptq_and_runs_auto_awq_for_its_own_names():
    req = quantized("meta-llama__Meta-Llama-3.1-8B", AWQ, quantization="gptq")
    [f] = quant_findings(req)
    assert (f.rule, f.severity.value, f.field) == ("quant_mismatch", "error", "engine_args.quantization")
    assert f.message == (
        "Quantization method specified in the model config (awq, from config.json) "
        "does not match the quantization method specified in the `quantization` argument (gptq)."
    )
    assert f.remedy == {"quantization": "awq"}
    ok = quantized("meta-llama__Meta-Llama-3.1-8B", AWQ, quantization="awq_marlin")
    assert quant_findings(ok) == []
    argv = run(ok).argv
    assert argv[argv.index("--quantization") + 1] == "auto_awq"  # auto_awq.py:263-286


def test_the_reconciliation_follows_the_target_release_and_gpu():
    """vLLM 0.10.2 converts AWQ to Marlin only on 8.0+ GPUs (awq_marlin.py:108-130, utils/marlin_utils.py:46):
    ``awq_marlin`` on a T4 matches no override there and is refused; 0.33 runs auto_awq for it."""
    old = quantized("meta-llama__Meta-Llama-3.1-8B", AWQ, gpu="t4-16gb", count=1, quantization="awq_marlin")
    old["vllm_version"] = "0.10.2"
    [f] = quant_findings(old)
    assert f.rule == "quant_mismatch" and f.message.endswith("`quantization` argument (awq_marlin).")
    assert f.remedy == {"quantization": "awq"}
    old["hardware"]["gpu"] = "a100-sxm4-80gb"
    assert quant_findings(old) == []
    old["vllm_version"] = "0.33.0"
    old["hardware"]["gpu"] = "t4-16gb"
    assert quant_findings(old) == []


def test_an_override_s_own_refusal_is_vllm_s_text():
    [f] = quant_findings(request("openai__gpt-oss-120b", quantization="humming"))
    assert (f.rule, f.field) == ("quant_mismatch", "engine_args.quantization")
    assert f.message == (
        "For gpt-oss model, use '--moe-backend humming' instead of '--quantization humming'. (`quantization` "
        "argument: humming; vllm 0.33.0 vllm/model_executor/layers/quantization/humming.py:179)"
    )
    assert f.remedy == {"quantization": "mxfp4"}  # the checkpoint's own name, which the override accepts


def test_gpt_oss_mxfp4_takes_any_flag_and_deepseek_v4_fp8_too():
    """GptOssMxfp4Config and DeepseekV4FP8Config override the checkpoint without reading the flag (mxfp4.py:129-146;
    vllm/models/deepseek_v41/quant_config.py:164-191), so even a method 0.33 does not know loads."""
    for flag in ("bitsandbytes", "awq", "mxfp4"):
        assert quant_findings(request("openai__gpt-oss-120b", count=1, quantization=flag)) == []
    assert quant_findings(request("deepseek-ai__DeepSeek-V4-Pro", quantization="bitsandbytes")) == []
    [f] = quant_findings(request("openai__gpt-oss-120b", count=1, quantization="humming"))
    assert f.rule == "quant_mismatch"  # humming is probed first and refuses gpt-oss (humming.py:179-191)


def test_a_flag_that_contradicts_config_json_is_a_mismatch():
    [f] = quant_findings(request(QWEN_FP8, quantization="gptq"))
    assert f.rule == "quant_mismatch" and "(fp8, from config.json)" in f.message and "argument (gptq)" in f.message
    assert f.remedy == {"quantization": "fp8"}
    assert quant_findings(request(QWEN_FP8, quantization="fp8")) == []


def test_a_none_tag_on_quantized_weights_is_a_mismatch():
    req = request(QWEN_FP8)
    req["model"]["quantization_txt"] = "none"
    [f] = quant_findings(req)
    assert (f.rule, f.field) == ("quant_mismatch", "model.quantization_txt")
    assert f.message == (
        "quantization.txt says the weights are not quantized (none), but the checkpoint's config "
        "names fp8 (from config.json); vLLM loads them as fp8."
    )
    assert f.remedy == {"quantization_txt": "fp8"}
    req["model"]["quantization_txt"] = "fp8"
    assert quant_findings(req) == []


def test_a_pre_quantized_method_on_unquantized_weights_has_no_config():
    [f] = quant_findings(request(PLAIN, quantization="awq"))
    assert (f.rule, f.severity.value, f.field) == ("quant_no_config", "error", "engine_args.quantization")
    assert f.message.startswith(
        "Cannot find the config file for awq: the checkpoint's config.json has no "
        "quantization_config (and no hf_quant_config.json)"
    )
    assert f.remedy == {"quantization": "fp8_per_tensor"}
    assert quant_findings(request(PLAIN, quantization="fp8_per_tensor")) == []


def test_methods_vllm_builds_without_a_checkpoint_config_are_not_refused():
    """What get_quant_config does with no checkpoint config comes from the release (generated ``no_config``): in 0.33
    mxfp4 is an online shorthand and builds (vllm/config/quantization.py), compressed-tensors cannot be built."""
    assert quant_findings(request(PLAIN, quantization="mxfp4")) == []
    [f] = quant_findings(request(PLAIN, quantization="compressed-tensors"))
    assert (f.rule, f.field) == ("quant_no_config", "engine_args.quantization")
    assert f.message.startswith(
        "vLLM 0.33.0 cannot build compressed-tensors for a checkpoint without a quantization config (TypeError: "
        "CompressedTensorsConfig.__init__() missing 3 required positional arguments"
    )


def test_online_fp8_is_deprecated_for_fp8_per_tensor():
    [f] = quant_findings(request(PLAIN, quantization="fp8"))
    assert (f.rule, f.severity.value) == ("quant_fp8_online_deprecated", "warning")
    assert "use --quantization fp8_per_tensor instead" in f.message
    assert f.remedy == {"quantization": "fp8_per_tensor"}
    assert quant_findings(request(PLAIN)) == []
