"""mm_limits_invalid and mm_item_exceeds_batched_tokens (service/domain/rules/multimodal.py) on a real
vision-language config (Qwen2-VL-7B-Instruct)."""

from __future__ import annotations

import pytest

from tests.support.multimodal import vl_request


def test_disable_chunked_mm_input_needs_the_largest_item_in_one_step():
    """compute_mm_encoder_budget raises when --disable-chunked-mm-input and the largest item (16,384 tokens for
    Qwen2-VL's official limit) exceeds max_num_batched_tokens (encoder_cache_manager.py:360-371)."""
    from service.domain.validate import validate

    bad = validate(
        vl_request(
            max_model_len=32768,
            disable_chunked_mm_input=True,
            max_num_batched_tokens=8192,
            limit_mm_per_prompt={"image": 1, "video": 0},
        )
    )
    f = next(f for f in bad.findings if f.rule == "mm_item_exceeds_batched_tokens")
    assert f.severity.value == "error" and f.remedy["max_num_batched_tokens"] == 16384
    ok = validate(
        vl_request(
            max_model_len=32768,
            disable_chunked_mm_input=True,
            max_num_batched_tokens=16384,
            limit_mm_per_prompt={"image": 1, "video": 0},
        )
    )
    assert "mm_item_exceeds_batched_tokens" not in {f.rule for f in ok.findings}
    chunked = validate(vl_request(max_model_len=32768, max_num_batched_tokens=8192))
    assert "mm_item_exceeds_batched_tokens" not in {f.rule for f in chunked.findings}


@pytest.mark.parametrize(
    "limit",
    [
        {"image": -5},
        {"image": {"count": "x"}},
        [1, 2],
        {"image": 1.5},
        {"image": True},
        {"image": {"count": 1, "frames": 3}},
        {"video": {"num_frames": 0}},
        '{"image": -1}',
    ],
)
def test_junk_mm_limits_are_errors_naming_the_field(limit):
    """vLLM 0.33 validates --limit-mm-per-prompt at start-up (vllm/config/multimodal.py:211-236, 471-495): counts
    ≥ 0, sizes > 0, only the modality's options — a plan must not be signed with one it refuses."""
    from service.domain.validate import validate

    r = validate(vl_request(limit_mm_per_prompt=limit))
    errs = [f for f in r.errors if f.rule == "mm_limits_invalid"]
    assert r.verdict == "reject" and errs and errs[0].field == "engine_args.limit_mm_per_prompt", limit


def test_good_mm_limits_and_kwargs_pass():
    from service.domain.validate import validate

    for limit in (
        {"image": 2, "video": 0},
        {"image": {"count": 1, "width": 512, "height": 512}},
        {"video": {"count": 1, "num_frames": 8}},
        '{"image": 1}',
    ):
        r = validate(vl_request(limit_mm_per_prompt=limit, mm_processor_kwargs={"max_pixels": 1003520}))
        assert not [f for f in r.findings if f.rule == "mm_limits_invalid"], limit


@pytest.mark.parametrize(
    "kwargs",
    [{"max_pixels": -1}, {"max_pixels": "x"}, {"max_pixels": 1.5}, {"max_pixels": True}, {"size": {"longest_edge": 0}}],
)
def test_junk_image_sizes_are_refused(kwargs):
    from pydantic import ValidationError

    from service.domain.validate import validate

    r = validate(vl_request(mm_processor_kwargs=kwargs))
    assert [f.field for f in r.errors if f.rule == "mm_limits_invalid"] == ["engine_args.mm_processor_kwargs"]
    with pytest.raises(ValidationError) as err:
        vl_request(preprocessor=kwargs)
    assert err.value.errors()[0]["loc"] == ("model", "preprocessor_config")
