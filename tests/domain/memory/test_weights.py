"""Weights (service/domain/memory/weights.py) on real configs: parameters from config.json, MXFP4 experts, and a
manifest's weights_bytes split like the estimate."""

from __future__ import annotations

import pytest

from service.domain.context import build_context
from service.domain.memory import compute_budget, estimate_weights
from service.domain.request import LaunchRequest
from tests.support import request
from tests.support.memory import budget


def test_llama31_70b_params_from_config():
    ctx, b = budget("meta-llama__Meta-Llama-3.1-70B", tensor_parallel_size=4)
    assert b.weights_params == pytest.approx(70.55e9, rel=0.002)


def test_manifest_weights_bytes_used_when_known():
    req = request("meta-llama__Meta-Llama-3.1-70B", tensor_parallel_size=4)
    req["model"]["weights_bytes"] = 141_107_412_992  # bf16 70.55e9 × 2
    ctx = build_context(LaunchRequest.model_validate(req))
    b = compute_budget(ctx)
    assert b.weights_source.startswith("manifest")
    assert b.weights_bytes_per_gpu == pytest.approx(141_107_412_992 / 4, rel=0.01)


def test_gpt_oss_mxfp4_weights():
    """gpt-oss-120b: ~61 GB checkpoint (MXFP4 experts, bf16 attention/embeddings) on one GPU."""
    ctx = build_context(LaunchRequest.model_validate(request("openai__gpt-oss-120b", count=1)))
    est = estimate_weights(ctx.facts, 1, 1, False, 2, None)
    assert 60e9 <= est.total_bytes <= 67e9
