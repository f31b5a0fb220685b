"""A real vision-language config (Qwen2-VL-7B-Instruct) and a launch request built on it (shared by the multimodal
memory tests and the multimodal rule tests)."""

from __future__ import annotations

import copy

from service.domain.request import LaunchRequest
from tests.support import CASES, load_case

# Qwen2-VL-7B-Instruct's config.json, as the ui-tars case carries it (a real copy, see its config_provenance)
UI_TARS = load_case(CASES / "kv" / "ui-tars-7b-24gb-v066.json")
QWEN2_VL_7B = UI_TARS["model"]["config"]


def vl_request(
    config: dict = QWEN2_VL_7B,
    gpu: str = "h100-sxm-80gb",
    count: int = 1,
    version: str | None = None,
    interconnect: str | None = None,
    preprocessor: dict | None = None,
    **engine_args,
) -> LaunchRequest:
    return LaunchRequest.model_validate(
        {
            "model": {
                "name": "Qwen/Qwen2-VL-7B-Instruct",
                "config": copy.deepcopy(config),
                "preprocessor_config": preprocessor,
            },
            "hardware": {"gpu": gpu, "count": count, "interconnect": interconnect},
            "environment": "benchmark",
            "vllm_version": version,
            "engine_args": engine_args,
        }
    )
