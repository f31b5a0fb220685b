"""The hardware rules (service/domain/rules/hardware.py): GPU capability and bfloat16 support on real configs; the
accept-side sweep covers the dtype and KV-cache dtype rules too."""

from __future__ import annotations

import pytest

from tests.support import request
from tests.support.rules import FIXTURES, errors, found

FAMILY = ("gpu_min_capability", "bf16_capability", "fp16_forbidden", "kv_dtype_invalid", "kv_dtype_capability")
GPUS = ("h100-sxm-80gb", "a100-sxm4-80gb", "l40s-48gb", "h200-141gb")


@pytest.mark.parametrize("model", FIXTURES)
@pytest.mark.parametrize("gpu", GPUS)
def test_accept_side_fixture_models_default_dtype(model, gpu):
    assert (
        errors(
            request(model, gpu=gpu, count=8, nodes=2, tensor_parallel_size=8, distributed_executor_backend="ray"),
            *FAMILY,
        )
        == []
    )


@pytest.mark.parametrize("gpu", ("v100-32gb", "v100-16gb"))
def test_v100_cannot_run_033(gpu):
    (f,) = errors(request("meta-llama__Llama-3.1-8B-Instruct", gpu=gpu, count=1, dtype="float16"), "gpu_min_capability")
    assert "7.0" in f.message and f.remedy == {"min_compute_capability": 75}


def test_v100_fine_on_old_line():
    req = request("meta-llama__Llama-3.1-8B-Instruct", gpu="v100-32gb", count=1, dtype="float16")
    req["vllm_version"] = "0.10.1"
    assert errors(req, "gpu_min_capability") == []


def test_bf16_explicit_on_t4_is_error_auto_is_info():
    (f,) = errors(
        request("meta-llama__Llama-3.1-8B-Instruct", gpu="t4-16gb", count=1, dtype="bfloat16"), "bf16_capability"
    )
    assert "compute capability 7.5" in f.message and f.remedy == {"dtype": "float16"}
    auto = found(request("meta-llama__Llama-3.1-8B-Instruct", gpu="t4-16gb", count=1), "bf16_capability")
    assert [x.severity.value for x in auto] == ["info"] and "Falling back to torch.float16" in auto[0].message


def test_device_ids():
    llama = "meta-llama__Llama-3.1-8B-Instruct"
    (f,) = errors(request(llama, count=1, device_ids="abc"), "device_ids")
    assert f.message.startswith("Non-integer device ID 'abc' is not supported by cuda.")
    (f,) = errors(request(llama, count=2, device_ids="0,0"), "device_ids")
    assert f.message == "--device-ids must not contain duplicates: [0, 0]"
    (f,) = errors(request(llama, count=2, device_ids="0,GPU-1b2c"), "device_ids")
    assert f.message == "--device-ids must not mix integer IDs and UUIDs"
    assert not errors(request(llama, count=2, tensor_parallel_size=2, device_ids="0,1"), "device_ids")
    uuid = "GPU-8f6b2a10-5c1d-4e1f-9a63-0c2d9e7b1a44"
    assert not errors(request(llama, count=1, device_ids=uuid), "device_ids")  # NVML resolves UUIDs on the node
