"""What vLLM's config-class validators refuse beyond the generated type facts (service/domain/config_validators.py,
numa_bind in rules/parallel_extras.py, video_pruning_rate in rules/multimodal.py): each refusal here was made by
vLLM 0.33.0's own parser and create_engine_config on the same launch (tests/cases/differential/*-val-*.json), with
the message quoted; the accepted values were accepted by it."""

from __future__ import annotations

import pytest

from service.domain.config_validators import CHECKS, option_problems
from service.domain.request import LaunchRequest
from service.domain.validate import validate
from tests.support import request
from tests.support.catalogue import LINE, flag_errors, judged

NAMES = LINE.names


def problems(name: str, value, line=(0, 33)):
    return option_problems(name, value, line, NAMES)[0]


@pytest.mark.parametrize(
    ("args", "field", "said"),
    [
        ({"compilation_config": {"mode": 7}}, "compilation_config.mode", "Input should be 0, 1, 2 or 3"),
        ({"compilation_config": {"mode": "fast"}}, "compilation_config.mode", "Invalid compilation mode: fast."),
        ({"compilation_config": {"mode": "3"}}, "compilation_config.mode", "Invalid compilation mode: 3."),
        (
            {"attention_config": {"backend_per_kind": [1]}},
            "attention_config.backend_per_kind",
            "Input should be an object",
        ),
        (
            {"attention_config": {"backend_per_kind": {"foo": "FLASH_ATTN"}}},
            "attention_config.backend_per_kind.foo",
            "Unknown KV cache group kind 'foo' in backend_per_kind.",
        ),
        (
            {"attention_config": {"backend_per_kind": {"full_attention": "nope"}}},
            "attention_config.backend_per_kind.full_attention",
            "Unknown attention backend: 'NOPE'. Valid options are: FLASH_ATTN,",
        ),
        (
            {"custom_histogram_buckets": {"request_latency": 5}},
            "custom_histogram_buckets.request_latency",
            "Input should be a valid list",
        ),
        (
            {"custom_histogram_buckets": {"request_latency": [1.0, 0.5]}},
            "custom_histogram_buckets.request_latency",
            "bounds [1.0, 0.5] must be strictly increasing",
        ),
        (
            {"custom_histogram_buckets": {"request_latency": [True]}},
            "custom_histogram_buckets.request_latency",
            "bound True must be a number, not a boolean",
        ),
        (
            {"custom_histogram_buckets": {"bogus": [1.0]}},
            "custom_histogram_buckets.bogus",
            "unknown bucket family 'bogus'",
        ),
        (
            {"custom_histogram_buckets": {"request_latency": [0, 1]}},
            "custom_histogram_buckets.request_latency",
            "bound 0.0 must be finite and greater than 0",
        ),
        ({"elastic_ep_max_dp_size": 0}, "elastic_ep_max_dp_size", "Input should be greater than or equal to 1"),
        (
            {"show_hidden_metrics_for_version": "not-a-version"},
            "show_hidden_metrics_for_version",
            "Invalid version: 'not-a-version'",
        ),
        (
            {"ec_transfer_config": {"ec_connector": "ECExampleConnector"}},
            "ec_transfer_config.ec_role",
            "Please specify ec_role when ec_connector is set, supported roles are ('ec_producer', 'ec_both', "
            "'ec_consumer')",
        ),
        (
            {"kv_transfer_config": {"kv_connector": "NixlConnector"}},
            "kv_transfer_config.kv_role",
            "Please specify kv_role when kv_connector is set, supported roles are ('kv_producer', 'kv_both', "
            "'kv_consumer')",
        ),
        (
            {"profiler_config": {"proton_profiler_dir": "/tmp/p"}},
            "profiler_config.proton_profiler_dir",
            "proton_profiler_dir only applicable when profiler is set to 'proton'",
        ),
        (
            {"profiler_config": {"profiler": "torch"}},
            "profiler_config.torch_profiler_dir",
            "torch_profiler_dir must be set when profiler is 'torch'",
        ),
        (
            {
                "profiler_config": {
                    "profiler": "proton",
                    "proton_profiler_dir": "/p",
                    "proton_output_format": "chrome_trace",
                }
            },
            "profiler_config.proton_output_format",
            "chrome_trace output requires proton_data='trace'",
        ),
        (
            {"profiler_config": {"profiler": "proton", "proton_profiler_dir": "s3://b/p"}},
            "profiler_config.proton_profiler_dir",
            "proton_profiler_dir must be a local directory",
        ),
        (
            {"profiler_config": {"capture_torch_profiler": True}},
            "profiler_config.capture_torch_profiler",
            "capture_torch_profiler is only applicable when profiler is set to 'torch'",
        ),
        (
            {"pooler_config": {"enable_flash_late_interaction": "maybe"}},
            "pooler_config.enable_flash_late_interaction",
            "Input should be a valid boolean, unable to interpret input",
        ),
        ({"pooler_config": {"logit_sigma": 0}}, "pooler_config.logit_sigma", "logit_sigma cannot be 0"),
        (
            {"pooler_config": {"pooling_type": "MEAN", "seq_pooling_type": "CLS"}},
            "pooler_config.seq_pooling_type",
            "Cannot set both `pooling_type` and `seq_pooling_type`",
        ),
        ({"ir_op_priority": {"rms_norm": 5}}, "ir_op_priority.rms_norm", "invalid parse_dataclass value"),
        ({"ir_op_priority": {"rms_norm": [1]}}, "ir_op_priority.rms_norm", "Assertion failed"),
        ({"ir_op_priority": {"rms_norm": {"a": 1}}}, "ir_op_priority.rms_norm", "Input should be a valid list"),
        (
            {"kernel_config": {"ir_op_priority": {"rms_norm": 5}}},
            "kernel_config.ir_op_priority.rms_norm",
            "invalid parse_dataclass value",
        ),
    ],
)
def test_what_vllm_033_refused(args, field, said):
    (f,) = flag_errors(judged(args))
    assert f.rule == "flag_unsupported" and f.field == f"engine_args.{field}"
    assert said in f.message, f.message
    assert f.data["problems"][0]["path"] == field and f.data["reference"].startswith("vllm 0.33.0 vllm/")


@pytest.mark.parametrize(
    "args",
    [
        {"compilation_config": {"mode": "vllm_compile"}},
        {"compilation_config": {"mode": 3.0}},
        {"compilation_config": {"mode": None}},
        {"attention_config": {"backend_per_kind": {"full_attention": "flash_attn"}}},
        {"custom_histogram_buckets": {"request_latency": [0.1, 1, "2.5"]}},
        {"elastic_ep_max_dp_size": 2},
        {"show_hidden_metrics_for_version": "0.7"},
        {"ec_transfer_config": {"ec_connector": "ECExampleConnector", "ec_role": "ec_consumer"}},
        {"kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": "kv_both"}},
        {"pooler_config": {"logit_sigma": 2.0, "enable_flash_late_interaction": "false"}},
        {"ir_op_priority": {"rms_norm": "native"}},
        {"ir_op_priority": {"rms_norm": ["native", "vllm_c"]}},
    ],
)
def test_what_vllm_033_accepted(args):
    assert flag_errors(judged(args)) == []


def test_the_compilation_mode_fix_lists_the_members():
    (f,) = flag_errors(judged({"compilation_config": {"mode": "fast", "backend": "inductor"}}))
    assert f.remedy["compilation_config"][0] == {"mode": "NONE", "backend": "inductor"}
    assert [r["mode"] for r in f.remedy["compilation_config"]] == [
        "NONE",
        "STOCK_TORCH_COMPILE",
        "DYNAMO_TRACE_ONCE",
        "VLLM_COMPILE",
    ]


def test_checks_are_gated_per_release_line():
    # show_hidden_metrics_for_version is validated since 0.11.2 (observability.py:84-90); 0.10.2 only stores it
    assert problems("show_hidden_metrics_for_version", "x y", (0, 10)) == []
    assert problems("show_hidden_metrics_for_version", "x y", (0, 11))
    # backend_per_kind came in 0.26.0; the Proton checks in 0.28.0; custom_histogram_buckets in 0.32.0
    assert problems("attention_config", {"backend_per_kind": [1]}, (0, 24)) == []
    assert problems("profiler_config", {"proton_profiler_dir": "/p"}, (0, 26)) == []
    assert problems("profiler_config", {"proton_profiler_dir": "/p"}, (0, 28))
    assert problems("custom_histogram_buckets", {"x": [1]}, (0, 30)) == []
    # the KV role check is as old as the class: vLLM up to 0.10.2 words it "kv_disagg_role"
    (old,) = problems("kv_transfer_config", {"kv_connector": "PyNcclConnector"}, (0, 6))
    assert "Please specify kv_disagg_role when kv_connector is set" in old.problem


def test_a_backend_name_is_not_refused_off_the_generated_line():
    # a 0.33.4 request is judged by the 0.33.0 names; a 0.34 one (no such line yet) by them too, but not refused
    value = {"backend_per_kind": {"full_attention": "SOME_NEW_BACKEND"}}
    assert option_problems("attention_config", value, (0, 33), None)[0] == []
    assert problems("attention_config", value)


HOSTILE = [None, True, 0, -1, 1e308, float("nan"), "", "x" * 5000, [], [None], {}, {"": None}, [[[]]], {"a": {"b": []}}]


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_hostile_values_give_findings_never_exceptions(name):
    for value in HOSTILE:
        problems(name, value)
        problems(name, {k: value for k in ("mode", "backend_per_kind", "profiler", "kv_connector", "rms_norm")})
        problems(name, {"request_latency": [value, 1e309, "inf"]})


LLAMA8 = "meta-llama__Llama-3.1-8B-Instruct"
SCOUT = "meta-llama__Llama-4-Scout-17B-16E-Instruct"


def _errors(req: dict, rule: str):
    result = validate(LaunchRequest.model_validate(req), alternatives=False)
    return [f for f in result.findings if f.rule == rule and f.severity.value == "error"]


@pytest.mark.parametrize(
    ("cpus", "said"),
    [
        (["0-3,a"], "numa_bind_cpus entries must use numactl CPU list syntax, for example '0-3' or '0,2,4-7'."),
        (["3-1"], "numa_bind_cpus ranges must be ascending, but got '3-1'."),
        ([""], "numa_bind_cpus entries must not be empty."),
    ],
)
def test_numa_bind_cpus_entries(cpus, said):
    (f,) = _errors(request(LLAMA8, count=1, numa_bind=True, numa_bind_cpus=cpus), "numa_bind")
    assert f.message == f"numa_bind_cpus: Value error, {said}" and f.field == "engine_args.numa_bind_cpus"


def test_numa_bind_nodes_entries_and_good_lists():
    (f,) = _errors(request(LLAMA8, count=1, numa_bind=True, numa_bind_nodes=[0, -1]), "numa_bind")
    assert f.message == "numa_bind_nodes: Value error, numa_bind_nodes must contain non-negative integers."
    assert not _errors(request(LLAMA8, count=1, numa_bind=True, numa_bind_cpus=["0-3,8", "4,6-7"]), "numa_bind")
    # both the entries and the missing --numa-bind: vLLM's field validator speaks first, the model validator after
    both = _errors(request(LLAMA8, count=1, numa_bind_cpus=["x"]), "numa_bind")
    assert both[0].message.startswith("numa_bind_cpus: Value error, numa_bind_cpus entries must use numactl")
    assert both[1].message.startswith("numa_bind_nodes and numa_bind_cpus require numa_bind=True.")


def test_video_pruning_rate_only_for_a_multimodal_model():
    (f,) = _errors(
        request(SCOUT, tensor_parallel_size=8, max_model_len=8192, video_pruning_rate=1.0), "mm_limits_invalid"
    )
    assert "video_pruning_rate: Input should be less than 1" in f.message
    assert "Llama4ForConditionalGeneration" in f.message and f.field == "engine_args.video_pruning_rate"
    assert not _errors(
        request(SCOUT, tensor_parallel_size=8, max_model_len=8192, video_pruning_rate=0.0), "mm_limits_invalid"
    )
    # a text-only model: vLLM builds no MultiModalConfig and ignores the option
    assert not _errors(request(LLAMA8, count=1, video_pruning_rate=1.5), "mm_limits_invalid")
