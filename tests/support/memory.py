"""The memory budget of a fixture model's launch (shared by the tests of service/domain/memory)."""

from __future__ import annotations

from service.domain.context import build_context
from service.domain.memory import compute_budget
from service.domain.request import LaunchRequest
from tests.support import request


def budget(model: str, gpu: str = "h100-sxm-80gb", count: int = 8, **engine_args):
    """The launch context and memory budget of a fixture model on catalogue GPUs."""
    ctx = build_context(LaunchRequest.model_validate(request(model, gpu, count=count, **engine_args)))
    return ctx, compute_budget(ctx)
