"""The vLLM 0.33 catalogue line, a valid value of each option's kind, and a launch of one GPU judged with given
engine arguments (shared by the catalogue tests, the flag and argv rule tests and the check of the rendered argv
with vLLM's own parser)."""

from __future__ import annotations

from service.domain.engine_args import RESERVED
from service.domain.request import LaunchRequest
from service.domain.validate import validate
from service.domain.versions import Kind, resolve_version
from tests.support import request

LINE = resolve_version("0.33.0")[1]
MODEL = "meta-llama__Meta-Llama-3.1-8B"


# Options whose value is judged by a rule of their own (memory, parallelism, quantization, policy): a valid value of
# the right kind can still be a rejected launch; here only the value's kind is judged.
JUDGED_ELSEWHERE = {
    "quantization",
    "kv_cache_dtype",
    "max_model_len",
    "gpu_memory_utilization",
    "dtype",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "block_size",
    "enforce_eager",
    "cpu_offload_gb",
    "kv_cache_memory_bytes",
    "num_gpu_blocks_override",
    "max_num_seqs",
    "max_num_batched_tokens",
    "data_parallel_size_local",
    "nnodes",
    "node_rank",
    "decode_context_parallel_size",
    "distributed_executor_backend",
    "config",
    "model_loader_extra_config",
    "hf_config_path",
    "tokenizer",
    "hf_overrides",
    "load_format",
    "async_scheduling",
    "enable_expert_parallel",
    "speculative_config",
    "seed",
    "revision",
}


def _least(facts):
    """The simplest value a config field's facts allow (service/domain/config_values.py)."""
    if facts.get("choices"):
        return facts["choices"][0]
    return {"str": "x", "bool": True, "dict": {}, "list": [], "object": {}}.get(
        facts.get("type"), facts.get("ge", facts.get("gt", 0) + 1)
    )


# Options whose config class validates the text further (service/domain/config_validators.py): a value it takes
VALIDATED = {"show_hidden_metrics_for_version": "0.7"}


def valid_value(opt):
    """A value of the option's kind that vLLM's parser accepts."""
    if opt.dest in VALIDATED:
        return VALIDATED[opt.dest]
    if opt.choices:
        return opt.choices[0] if not opt.is_list else [opt.choices[0]]
    if (opt.value_facts or {}).get("choices"):  # a string the parser passes on to a config field with choices
        return str(opt.value_facts["choices"][0])
    required = {k: f for k, f in ((opt.json_keys or {}).get("values") or {}).items() if f.get("required")}
    if required:  # the config class has keys without a default: the smallest value its validation accepts
        return {k: _least(f) for k, f in required.items()}
    if opt.action == "LoRAParserAction":
        return ["adapter=/loras/adapter"]
    value = {
        Kind.BOOL: True,
        Kind.FLAG: True,
        Kind.BOOL_VALUE: True,
        Kind.INT: 2,
        Kind.FLOAT: 0.5,
        Kind.STR: "x",
        Kind.JSON: {},
        Kind.JSON_OR_STR: {},
        Kind.SIZE: "4k",
        Kind.SIZE_OR_AUTO: "4k",
    }[opt.kind]
    return [value] if opt.is_list and opt.kind is not Kind.JSON else value


OPTIONS = sorted(n for n in LINE.options if n not in RESERVED)


def judged(engine_args: dict, version: str = "0.33.0"):
    """Validate the one-GPU launch of MODEL with these engine arguments (no alternatives searched)."""
    req = request(MODEL, count=1)
    req["engine_args"] = dict(engine_args)
    req["vllm_version"] = version
    return validate(LaunchRequest.model_validate(req), alternatives=False)


def flag_errors(result):
    """The errors of the option rules: unknown options and values, the argv that does not parse back, the model
    reference vLLM would misread."""
    return [
        f
        for f in result.findings
        if f.severity.value == "error" and f.rule in ("flag_unsupported", "argv_roundtrip", "model_reference")
    ]
