"""The plan environment's policy (service/domain/env_policy.py): variables that pick where code or weights come from
are refused, ordinary tuning variables are allowed."""

from __future__ import annotations

import pytest

from service.domain.env_policy import refused


@pytest.mark.parametrize(
    "name",
    [
        "CUDA_INJECTION64_PATH",
        "TRITON_PTXAS_PATH",
        "TRITON_LIBCUDA_PATH",
        "TRITON_HOME",
        "NCCL_NET_PLUGIN",
        "NCCL_TUNER_PLUGIN",
        "HF_HOME",
        "HF_ENDPOINT",
        "UCX_MODULE_DIR",
        "VLLM_CACHE_ROOT",
        "TORCH_HOME",
        "VLLM_USE_MODELSCOPE",
    ],
)
def test_env_that_names_where_code_or_weights_come_from_is_refused(name):
    assert [n for n, _ in refused({name: "/tmp/evil"})] == [name]


@pytest.mark.parametrize(
    "name",
    [
        "NCCL_SOCKET_IFNAME",
        "CUDA_VISIBLE_DEVICES",
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
        "HF_HUB_OFFLINE",
        "VLLM_ATTENTION_BACKEND",
        "NCCL_IB_HCA",
        "GLOO_SOCKET_IFNAME",
        "VLLM_PP_LAYER_PARTITION",
        "PYTORCH_CUDA_ALLOC_CONF",
        "OMP_NUM_THREADS",
    ],
)
def test_ordinary_tuning_env_is_still_allowed(name):
    assert refused({name: "x"}) == []


@pytest.mark.parametrize(
    "name,value",
    [
        ("TRITON_CACHE_MANAGER", "evil.mod:Manager"),  # triton imports the module:class it names (runtime/cache.py)
        ("TRITON_REMOTE_CACHE_BACKEND", "evil.mod:Backend"),
        ("UCX_GDB_COMMAND", "/tmp/evil"),  # UCX runs it on a fault (with UCX_HANDLE_ERRORS=debug)
    ],
)
def test_env_that_names_code_to_import_or_a_command_to_run_is_refused(name, value):
    assert [n for n, _ in refused({name: value})] == [name]
