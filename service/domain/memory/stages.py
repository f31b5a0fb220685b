"""Pipeline stages and layer patterns: which decoder layers a PP stage holds, in closed form (no work per layer).

vLLM splits ``L`` layers over ``pp`` stages as ``L // pp`` each, the remainder added to the stages before the last
(vllm 0.33.0 vllm/distributed/utils.py:198-241). The pool is the minimum over the GPUs of an instance, so the
budget is sized on the stage with the most layers.
"""

from __future__ import annotations


def pp_partition(layers: int, pp: int) -> list[int]:
    """vLLM's layer split over PP stages: ``L // pp`` each, the remainder added to stages -2, -3, ... (never the last)
    (vllm 0.33.0 vllm/distributed/utils.py:198-241). Builds a list of ``pp`` entries: for reports only; the budget
    uses ``stage_layers`` / ``biggest_stage`` (O(1))."""
    base, rem = divmod(layers, pp)
    parts = [base] * pp
    for i in range(rem):
        parts[-(i + 2) if pp > 1 else 0] += 1
    return parts


def stage_layers(layers: int, pp: int, s: int) -> tuple[int, int]:
    """``(first layer, layer count)`` of stage ``s`` under ``pp_partition`` — a closed form: the ``rem`` stages
    ``pp-1-rem … pp-2`` hold ``base + 1`` layers, the others ``base``."""
    base, rem = divmod(layers, pp)
    if pp == 1:
        return 0, layers
    first_big = pp - 1 - rem
    start = s * base + max(0, min(s, pp - 1) - first_big)
    return start, base + (1 if first_big <= s < pp - 1 else 0)


def biggest_stage(layers: int, pp: int) -> int:
    """The first stage holding the most layers (``max(range(pp), key=parts)`` without building ``parts``)."""
    rem = layers % pp
    return pp - 1 - rem if rem and pp > 1 else 0


def multiples(lo: int, hi: int, step: int) -> int:
    """How many ``i`` in ``[lo, hi)`` are multiples of ``step`` (lo, hi ≥ 0)."""
    if hi <= lo:
        return 0
    return (hi + step - 1) // step - (lo + step - 1) // step
