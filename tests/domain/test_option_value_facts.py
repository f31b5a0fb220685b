"""Top-level options judged by the config-class field EngineArgs hands them to (scripts/vllm_catalogue_inside.py
``EngineArgsSource.passed`` + ``option_values``: the field's pydantic facts in the catalogue's ``value_facts``),
with the same code that judges values inside JSON options (service/domain/config_values.py ``problems``).

Every refused value below is one vLLM's own class refuses (checked with the release's class in the catalogue
generator's environment: ``TypeAdapter(SchedulerConfig).validate_python({"watermark": 1.0})`` → "watermark: Input
should be less than 1"; the differential harness saw the same words from ``create_engine_config``), every accepted one
the boundary value the class takes."""

from __future__ import annotations

import pytest

from service.domain.config_values import problems
from service.domain.versions import resolve_version
from tests.support.catalogue import flag_errors, judged

RELEASES = ("0.33.0", "0.32.0")


def facts(option: str, version: str = "0.33.0") -> dict:
    return resolve_version(version)[1].options[option].value_facts


def test_the_catalogue_holds_the_field_each_option_is_handed_to():
    # vllm 0.33.0 vllm/config/scheduler.py:196 watermark: float = Field(default=0.0, ge=0.0, lt=1.0)
    assert facts("watermark") == {
        "class": "SchedulerConfig",
        "field": "watermark",
        "ge": 0.0,
        "lt": 1.0,
        "source": "vllm/config/scheduler.py:196",
        "type": "float",
    }
    # vllm 0.33.0 vllm/config/vllm.py:454 shutdown_timeout: int = Field(default=0, ge=0) (the option is typed by hand,
    # engine/arg_utils.py:1940-1945, and handed to VllmConfig at arg_utils.py:2915)
    assert facts("shutdown_timeout")["ge"] == 0 and facts("shutdown_timeout")["class"] == "VllmConfig"
    # vllm 0.33.0 vllm/config/model.py:435 media_io_kwargs: InitVar[dict[str, dict[str, Any]] | None]
    assert facts("media_io_kwargs")["values"] == {"type": "dict"}
    # vllm 0.33.0 vllm/config/load.py:108 pt_load_map_location: str | dict[str, str]
    assert facts("pt_load_map_location")["any_of"] == [{"type": "str"}, {"type": "dict", "values": {"type": "str"}}]
    # vllm 0.32.0 vllm/config/scheduler.py:213 stream_interval: int = Field(default=1, ge=1)
    assert facts("stream_interval", "0.32.0")["ge"] == 1


def test_no_facts_where_the_class_may_not_see_the_value():
    # LoRAConfig is built only with --enable-lora (vllm 0.33.0 engine/arg_utils.py:2691-2705: ``... if
    # self.enable_lora else None``): --max-loras 0 alone starts
    assert facts("max_loras") is None
    # MultiModalConfig's bound (config/multimodal.py:430, lt=1.0) is checked only for a multimodal model; ModelConfig's
    # InitVar (float | None) says nothing more than the parser
    assert facts("video_pruning_rate") is None
    # field validators (numa_bind_cpus syntax, show_hidden_metrics_for_version, elastic_ep_max_dp_size's wrap
    # validator) can accept or refuse anything: not read
    assert facts("numa_bind_cpus") is None and facts("show_hidden_metrics_for_version") is None
    assert facts("elastic_ep_max_dp_size") is None
    # a field whose parser type already says it all records nothing (max_num_seqs: int | None)
    assert facts("enable_prefix_caching") is None


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize(
    "args,words",
    [
        ({"watermark": 1.0}, "watermark = 1.0: Input should be less than 1"),
        ({"shutdown_timeout": -1}, "shutdown_timeout = -1: Input should be greater than or equal to 0"),
        ({"stream_interval": 0}, "stream_interval = 0: Input should be greater than or equal to 1"),
        ({"kv_cache_metrics_sample": 1.5}, "kv_cache_metrics_sample = 1.5: Input should be less than or equal to 1"),
        ({"max_num_queued_reqs": -1}, "max_num_queued_reqs = -1: Input should be greater than or equal to 0"),
        ({"long_prefill_token_threshold": -1}, "Input should be greater than or equal to 0"),
        ({"media_io_kwargs": {"video": 5}}, "media_io_kwargs.video = 5: Input should be a valid dictionary"),
        ({"pt_load_map_location": {"cuda:1": 0}}, "Input should be a valid string"),
    ],
)
def test_values_the_class_refuses_are_refused_naming_the_field(version, args, words):
    (f,) = flag_errors(judged(args, version))
    name = next(iter(args))
    assert f.rule == "flag_unsupported" and f.field == f"engine_args.{name}"
    assert words in f.message
    assert f.data["reference"].startswith(f"vllm {version} vllm/config/")


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize(
    "args",
    [
        {"watermark": 0.99},
        {"watermark": "0.999999"},
        {"watermark": 0},
        {"shutdown_timeout": 0},
        {"stream_interval": 1},
        {"kv_cache_metrics_sample": 1},
        {"kv_cache_metrics_sample": "0.5"},
        {"max_num_queued_reqs": 0},
        {"long_prefill_token_threshold": 0},
        {"media_io_kwargs": {"video": {"num_frames": 8}}},
        {"media_io_kwargs": {}},
        {"pt_load_map_location": "cuda"},
        {"pt_load_map_location": {"": "cuda:0"}},
    ],
)
def test_boundary_values_the_class_takes_pass(version, args):
    assert flag_errors(judged(args, version)) == []


def test_the_remedy_is_the_nearest_allowed_value():
    f = flag_errors(judged({"stream_interval": 0}))[0]
    assert f.remedy == {"stream_interval": [1]}
    assert flag_errors(judged({"watermark": 1.0}))[0].remedy is None  # lt: no nearest float


def test_a_union_passes_when_one_member_takes_the_whole_value():
    location = facts("pt_load_map_location")
    assert problems({"": "cuda:0"}, location) == [] and problems("cpu", location) == []
    (bad,) = problems({"a": 1}, location, "pt_load_map_location")
    assert bad.path == "pt_load_map_location"
    assert bad.problem == "Input should be a valid string | a: Input should be a valid string"


def test_a_line_generated_before_the_facts_judges_nothing():
    # 0.33.0's facts with the option's value_facts left out (as a catalogue not regenerated holds them)
    assert problems(1.0, {}) == []


@pytest.mark.parametrize(
    "args,words",
    [
        # vllm 0.13.0 vllm/config/scheduler.py:140 stream_interval: int = Field(default=1, ge=1)
        ({"stream_interval": 0}, "stream_interval = 0: Input should be greater than or equal to 1"),
        # vllm 0.13.0 vllm/config/observability.py:55 kv_cache_metrics_sample: float = Field(default=0.01, gt=0, le=1)
        ({"kv_cache_metrics_sample": 1.5}, "Input should be less than or equal to 1"),
        # vllm 0.13.0 vllm/config/model.py:289 media_io_kwargs: InitVar[dict[str, dict[str, Any]] | None]
        ({"media_io_kwargs": {"video": 5}}, "media_io_kwargs.video = 5: Input should be a valid dictionary"),
        # vllm 0.13.0 vllm/config/load.py:81 pt_load_map_location: str | dict[str, str]
        ({"pt_load_map_location": {"cuda:1": 0}}, "cuda:1: Input should be a valid string"),
    ],
)
def test_an_older_line_refuses_what_its_own_classes_refuse(args, words):
    (f,) = flag_errors(judged(args, "0.13.0"))
    assert f.field == f"engine_args.{next(iter(args))}" and words in f.message
    assert f.data["reference"].startswith("vllm 0.13.0 vllm/config/")


@pytest.mark.parametrize(
    "args",
    [
        {"stream_interval": 1},
        {"kv_cache_metrics_sample": 1},
        {"media_io_kwargs": {"video": {"num_frames": 8}}},
        {"pt_load_map_location": {"": "cuda:0"}},
        {"swap_space": 0},  # vllm 0.13.0 vllm/config/cache.py:57 swap_space: float = Field(default=4, ge=0)
    ],
)
def test_an_older_line_takes_the_boundary_values(args):
    assert flag_errors(judged(args, "0.13.0")) == []
