"""max_len_vs_positions (service/domain/rules/context_length.py): max_model_len above the length vLLM derives."""

from __future__ import annotations

from service.domain.request import LaunchRequest
from service.domain.validate import validate
from tests.support import request


def test_falcon_max_model_len_beyond_the_class_default_is_refused():
    req = request("tiiuae__falcon-40b", count=4, tensor_parallel_size=4, max_model_len=262144)
    r = validate(LaunchRequest.model_validate(req), alternatives=False)
    f = next(f for f in r.findings if f.rule == "max_len_vs_positions")
    assert f.severity.value == "error" and "(262144)" in f.message and "max_position_embeddings=2048" in f.message
