"""Supported vLLM version lines and their `vllm serve` flag catalogues.

Each line lists the engine arguments it accepts (vLLM's names, underscores) with their kind, the flags it no
longer accepts (with the release that removed them and what to do instead), its quantization method names and its
`gpu_memory_utilization` default. Sources: ../shared/vllm-rules.md §2.1, §6, §8 (vllm 0.33.0
vllm/engine/arg_utils.py; removals: PR #36216 for --swap-space in 0.18.0, recipes PR #856 for --rope-scaling /
--rope-theta in 0.11.1, worker-vllm PR #332 for --override-attention-dtype / --calculate-kv-scales in 0.28.0).

Older lines are kept for fleets that have not upgraded (and for the memory model, which follows the version that
printed a KV figure): 0.18-0.32 and 0.6-0.17 (where ``--swap-space`` still existed). They differ in the flags they
accept and in their quantization names (``bitsandbytes`` and ``gguf`` were still in core); every other rule is
judged with 0.33 semantics — an approximation, stated in the README.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from .errors import DomainError


class Kind(str, Enum):
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    STR = "str"
    JSON = "json"  # rendered as one JSON argument
    SIZE = "size"  # int or human-readable '8k' / '8K' (argparse_utils.py:30-94)
    STR_LIST = "str_list"


_COMMON: dict[str, Kind] = {
    # parallelism (arg_utils.py:1167-1215)
    "tensor_parallel_size": Kind.INT,
    "pipeline_parallel_size": Kind.INT,
    "data_parallel_size": Kind.INT,
    "data_parallel_size_local": Kind.INT,
    "data_parallel_rank": Kind.INT,
    "data_parallel_address": Kind.STR,
    "data_parallel_rpc_port": Kind.INT,
    "data_parallel_backend": Kind.STR,
    "data_parallel_external_lb": Kind.BOOL,
    "decode_context_parallel_size": Kind.INT,
    "enable_expert_parallel": Kind.BOOL,
    "enable_eplb": Kind.BOOL,
    "distributed_executor_backend": Kind.STR,
    "nnodes": Kind.INT,
    "node_rank": Kind.INT,
    "master_addr": Kind.STR,
    "master_port": Kind.INT,
    # memory and scheduler
    "gpu_memory_utilization": Kind.FLOAT,
    "kv_cache_memory_bytes": Kind.SIZE,
    "cpu_offload_gb": Kind.FLOAT,
    "max_model_len": Kind.SIZE,
    "max_num_seqs": Kind.INT,
    "max_num_batched_tokens": Kind.SIZE,
    "enable_chunked_prefill": Kind.BOOL,
    "enable_prefix_caching": Kind.BOOL,
    "block_size": Kind.INT,
    "num_gpu_blocks_override": Kind.INT,
    "max_cudagraph_capture_size": Kind.INT,
    "enforce_eager": Kind.BOOL,
    "async_scheduling": Kind.BOOL,
    "long_prefill_token_threshold": Kind.INT,
    "max_num_partial_prefills": Kind.INT,
    "performance_mode": Kind.STR,
    # model and weights
    "dtype": Kind.STR,
    "quantization": Kind.STR,
    "kv_cache_dtype": Kind.STR,
    "load_format": Kind.STR,
    "trust_remote_code": Kind.BOOL,
    "revision": Kind.STR,
    "tokenizer": Kind.STR,
    "tokenizer_mode": Kind.STR,
    "hf_overrides": Kind.JSON,
    "model_loader_extra_config": Kind.JSON,
    "speculative_config": Kind.JSON,
    "compilation_config": Kind.JSON,
    "quantization_config": Kind.JSON,
    "limit_mm_per_prompt": Kind.JSON,
    "mm_processor_kwargs": Kind.JSON,
    "disable_sliding_window": Kind.BOOL,
    "seed": Kind.INT,
    "attention_backend": Kind.STR,
    "allow_deprecated_quantization": Kind.BOOL,
    "generation_config": Kind.STR,
    "max_logprobs": Kind.INT,
    # serving front end
    "served_model_name": Kind.STR_LIST,
    "host": Kind.STR,
    "port": Kind.INT,
    "api_key": Kind.STR,
    "chat_template": Kind.STR,
    "enable_auto_tool_choice": Kind.BOOL,
    "tool_call_parser": Kind.STR,
    "reasoning_parser": Kind.STR,
    "enable_lora": Kind.BOOL,
    "max_lora_rank": Kind.INT,
    "max_loras": Kind.INT,
}

# Quantization method names vLLM 0.33.0 accepts (vllm/model_executor/layers/quantization/__init__.py:15-49,
# vllm/config/quantization.py:195-234).
QUANT_METHODS_033 = (
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
    "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors",
    "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8", "online",
    "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only", "nvfp4_per_token", "mxfp8",
)
# Methods that left core for plugins: name -> (release, plugin)
PLUGIN_ONLY_033 = {
    "bitsandbytes": ("0.28.0", "vllm-bnb-plugin (vllm-project/vllm#43529)"),
    "gguf": ("0.24.0", "vllm-gguf-plugin (vllm-project/vllm#39612)"),
}


@dataclass(frozen=True)
class RemovedFlag:
    removed_in: str
    advice: str
    source: str


@dataclass(frozen=True)
class VersionLine:
    """One supported vLLM release line (``0.33`` covers 0.33.x)."""

    line: str
    newest: str
    flags: dict[str, Kind]
    removed: dict[str, RemovedFlag]
    quant_methods: tuple[str, ...]
    plugin_only: dict[str, tuple[str, str]] = field(default_factory=dict)
    default_gpu_memory_utilization: float = 0.92
    first: tuple[int, int] = (0, 33)
    last: tuple[int, int] = (0, 33)

    def kind(self, name: str) -> Kind | None:
        return self.flags.get(name)


_REMOVED_033 = {
    "swap_space": RemovedFlag("0.18.0", "drop it: the V1 engine has no CPU swap space", "vllm-project/vllm#36216"),
    "rope_scaling": RemovedFlag(
        "0.11.1", 'use --hf-overrides \'{"rope_parameters": {...}}\'', "vllm-project/recipes#856"
    ),
    "rope_theta": RemovedFlag("0.11.1", 'use --hf-overrides \'{"rope_parameters": {...}}\'', "vllm-project/recipes#856"),
    "override_attention_dtype": RemovedFlag("0.28.0", "drop it", "runpod-workers/worker-vllm#332"),
    "calculate_kv_scales": RemovedFlag("0.28.0", "drop it", "runpod-workers/worker-vllm#332"),
    "task": RemovedFlag("0.11.0", "use --runner / --convert; vllm serve has no --task", "vllm/utils/argparse_utils.py:182-195"),
    "model": RemovedFlag("0.33.0", "give the model as the positional argument of vllm serve", "argparse_utils.py:324-355"),
}

VERSION_LINES: dict[str, VersionLine] = {
    "0.33": VersionLine(
        line="0.33",
        newest="0.33.0",
        flags=dict(_COMMON),
        removed=_REMOVED_033,
        quant_methods=QUANT_METHODS_033,
        plugin_only=PLUGIN_ONLY_033,
        default_gpu_memory_utilization=0.92,
        first=(0, 33),
        last=(0, 33),
    ),
    # 0.18 .. 0.32: --swap-space gone; bitsandbytes left core in 0.28.0, gguf in 0.24.0
    "0.18-0.32": VersionLine(
        line="0.18-0.32",
        newest="0.32.0",
        flags={**_COMMON, "override_attention_dtype": Kind.STR, "calculate_kv_scales": Kind.BOOL},
        removed={k: v for k, v in _REMOVED_033.items() if k not in ("override_attention_dtype", "calculate_kv_scales")},
        quant_methods=QUANT_METHODS_033 + ("bitsandbytes", "gguf"),
        plugin_only={},
        default_gpu_memory_utilization=0.9,
        first=(0, 18),
        last=(0, 32),
    ),
    # 0.6 .. 0.17: the line where --swap-space still existed (removed in 0.18.0, vllm-project/vllm#36216)
    "0.6-0.17": VersionLine(
        line="0.6-0.17",
        newest="0.17.1",
        flags={
            **_COMMON,
            "swap_space": Kind.FLOAT,
            "override_attention_dtype": Kind.STR,
            "calculate_kv_scales": Kind.BOOL,
        },
        removed={k: v for k, v in _REMOVED_033.items() if k in ("task", "model")},
        quant_methods=QUANT_METHODS_033 + ("bitsandbytes", "gguf"),
        plugin_only={},
        default_gpu_memory_utilization=0.9,
        first=(0, 6),
        last=(0, 17),
    ),
}
DEFAULT_VERSION = "0.33.0"
# every quantization method name of any supported line: what a manifest's quantization.txt may name
ALL_QUANT_METHODS = tuple(dict.fromkeys(m for line in VERSION_LINES.values() for m in line.quant_methods))


def parse_version(text: str) -> tuple[int, int, int] | None:
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-].*)?", text.strip())
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def resolve_version(version: str | None) -> tuple[str, VersionLine]:
    """Map ``0.33.0`` / ``0.33`` / ``v0.26.0`` / ``0.6.3.dev114+g4f95ffee`` to its line; None means the newest
    supported release. Returns the full version string and the line.

    Raises DomainError (field ``vllm_version``) for a version outside every supported line.
    """
    text = (version or DEFAULT_VERSION).strip()
    parsed = parse_version(text)
    for line in VERSION_LINES.values():
        if parsed and line.first <= parsed[:2] <= line.last:
            full = text.lstrip("v") if re.match(r"v?\d+\.\d+\.\d+", text) else "%d.%d.%d" % parsed
            return full, line
    raise DomainError(
        "vllm_version",
        f"vLLM version {version!r} is not supported; supported: "
        + ", ".join(f"{'.'.join(map(str, l.first))}..{'.'.join(map(str, l.last))}.x" for l in VERSION_LINES.values()),
        rule="version_unsupported",
        accepted=[v.newest for v in VERSION_LINES.values()],
    )
