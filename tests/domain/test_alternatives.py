"""nearest_alternatives: small engine_args changes that turn a rejected launch into one that passes."""

from __future__ import annotations

from service.domain.alternatives import nearest_alternatives
from service.domain.request import LaunchRequest
from service.domain.validate import validate
from tests.support import request


def _alts(req: dict):
    lr = LaunchRequest.model_validate(req)
    result = validate(lr)
    return result, nearest_alternatives(lr, result)


def _apply(req: dict, patch: dict) -> dict:
    args = dict(req["engine_args"])
    for k, v in patch.items():
        if v is None:
            args.pop(k, None)
        else:
            args[k] = v
    return {**req, "engine_args": args}


def test_accepted_request_has_no_alternatives():
    result, alts = _alts(request("meta-llama__Meta-Llama-3.1-70B", tensor_parallel_size=8, max_model_len=8192))
    assert result.verdict != "reject" and alts == []


def test_tp_alternatives_are_nearest_valid_sizes():
    req = request(
        "microsoft__Phi-3-medium-4k-instruct", gpu="a100-sxm4-80gb", count=4, tensor_parallel_size=4, max_model_len=4096
    )
    result, alts = _alts(req)
    assert result.verdict == "reject"
    assert alts[0] == {"tensor_parallel_size": 2}
    assert 1 <= len(alts) <= 3
    for patch in alts:
        assert validate(LaunchRequest.model_validate(_apply(req, patch))).verdict != "reject"


def test_expert_parallel_or_smaller_tp_for_fp8_blocks():
    req = request(
        "deepseek-ai__DeepSeek-V3",
        count=8,
        nodes=4,
        tensor_parallel_size=32,
        distributed_executor_backend="ray",
        max_model_len=8192,
    )
    result, alts = _alts(req)
    assert result.verdict == "reject"
    assert alts and alts[0] == {"tensor_parallel_size": 16}


def test_removed_flag_is_dropped():
    req = request("meta-llama__Llama-3.1-8B-Instruct", count=1, swap_space=4, max_model_len=8192)
    result, alts = _alts(req)
    assert result.verdict == "reject" and {"swap_space": None} in alts


def test_bf16_on_t4_goes_float16():
    req = request(
        "meta-llama__Llama-3.1-8B-Instruct",
        gpu="t4-16gb",
        count=1,
        dtype="bfloat16",
        max_model_len=2048,
        quantization="fp8_per_tensor",
    )
    result, alts = _alts(req)
    assert result.verdict == "reject"
    assert any(p.get("dtype") == "float16" for p in alts)
