"""The launch request: one schema for ``preflight check`` files and ``POST /v1/validate``.

It is the case format of tests/cases/README.md without ``id``, ``source``, ``summary`` and ``expect``. Unknown
fields are errors (``extra="forbid"``); ``engine_args`` keeps vLLM's own names (underscores) and is judged by the flag
catalogue of the target version (service/domain/versions.py), so a removed flag becomes a finding, not a 422.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from .jsoncheck import check_json
from .text import display_text

MAX_GPUS_PER_NODE = 64
MAX_NODES = 4096
MAX_SEQ = 100_000_000
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")
# a string shown to people: no control, invisible formatting or bidirectional characters (domain/text.py)
DisplayStr = Annotated[str, AfterValidator(display_text)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Checkpoint(Strict):
    """How the weights are laid out: ``merged`` (any TP can re-split them at load) or ``tp_sharded`` (saved per rank
    by vLLM ``sharded_state`` for one TP × PP)."""

    layout: Literal["merged", "tp_sharded"] = Field(
        default="merged",
        description="merged: one checkpoint vLLM splits at load time; tp_sharded: saved per rank (loads "
        "only at the tensor and pipeline parallel sizes it was saved at).",
    )
    tensor_parallel_size: Annotated[int, Field(ge=1, le=1024, strict=True)] | None = Field(
        default=None, description="For a tp_sharded checkpoint: the tensor parallel size it was saved at."
    )
    pipeline_parallel_size: Annotated[int, Field(ge=1, le=1024, strict=True)] | None = Field(
        default=None, description="For a tp_sharded checkpoint: the pipeline parallel size it was saved at."
    )

    @model_validator(mode="after")
    def _sharded_needs_tp(self) -> Checkpoint:
        if self.layout == "tp_sharded" and self.tensor_parallel_size is None:
            raise ValueError("checkpoint layout tp_sharded needs tensor_parallel_size (the TP it was saved at)")
        return self


TensorBytes = Annotated[int, Field(ge=0, le=1 << 50, strict=True)]


class TensorRanks(Strict):
    """A checkpoint's bytes by how vLLM shards them, per decoder layer (service/domain/rank_weights.py
    ``RankWeights.as_dict``): read from its safetensors headers, it replaces the config.json estimate."""

    layers: list[Annotated[list[TensorBytes], Field(min_length=4, max_length=4)]] = Field(
        max_length=4096,
        description="Per decoder layer: [bytes split over TP, k/v bytes (split over KV heads), bytes replicated, "
        "routed-expert bytes].",
    )
    embedding: Annotated[list[TensorBytes], Field(min_length=2, max_length=2)] = Field(
        description="[rows, bytes] of the input embedding ([0, 0] when absent)."
    )
    lm_head: Annotated[list[TensorBytes], Field(min_length=2, max_length=2)] = Field(
        description="[rows, bytes] of the LM head ([0, 0] when tied or absent)."
    )
    final: TensorBytes = Field(description="Other text-model tensors (the final norm): on the last PP stage.")
    excluded: TensorBytes = Field(description="Vision / audio towers (budgeted by their own profile).")

    def total(self) -> int:
        return sum(map(sum, self.layers)) + self.embedding[1] + self.lm_head[1] + self.final + self.excluded


def _safetensors_dtype(v: str) -> str:
    from .tensors import DTYPE_BITS

    if v not in DTYPE_BITS:
        raise ValueError(f"{v[:40]!r} is not a safetensors dtype")
    return v


TensorDim = Annotated[int, Field(ge=0, le=1 << 40, strict=True)]


class TensorParam(Strict):
    dtype: Annotated[str, AfterValidator(_safetensors_dtype)] = Field(description="The safetensors dtype (BF16, …).")
    shape: list[TensorDim] = Field(max_length=8, description="The tensor's shape as its header gives it.")


class TensorLinear(Strict):
    """One distinct linear module layout of the checkpoint (service/domain/linear_shapes.py ``ModuleShapes``)."""

    module: DisplayStr = Field(
        min_length=1, max_length=1100, description="The module name pattern, indices as * (model.layers.*.mlp.up_proj)."
    )
    count: Annotated[int, Field(ge=1, le=500_000, strict=True)] = Field(description="How many modules share it.")
    first: DisplayStr = Field(
        min_length=1, max_length=1100, description="The first of them (model.layers.0.mlp.up_proj)."
    )
    params: dict[Annotated[str, Field(min_length=1, max_length=128)], TensorParam] = Field(
        min_length=1, max_length=16, description="Its tensors by last name component (weight, weight_scale_inv, …)."
    )


class ModelSpec(Strict):
    """The weights to serve: ``config`` is the config.json object (the CLI may give ``path``, a directory holding
    config.json, quantization.txt, hf_quant_config.json and model.safetensors.index.json instead)."""

    name: DisplayStr | None = Field(
        default=None, max_length=512, description="The model's name (a label: Hugging Face id or your own)."
    )
    # judged with the other findings (render.model_reference_problem, rule model_reference: bidi, spaces, ``..``)
    uri: str | None = Field(default=None, max_length=2048, description="Where the node loads the weights from.")
    path: str | None = Field(default=None, max_length=4096, description="CLI only: a local model directory.")
    config: dict[str, Any] | None = Field(
        default=None,
        description="The model's config.json, as a JSON object: what every rule and the memory model read.",
    )
    hf_quant_config: dict[str, Any] | None = Field(
        default=None, description="hf_quant_config.json (ModelOpt checkpoints), when the checkpoint has one."
    )
    preprocessor_config: dict[str, Any] | None = Field(
        default=None,
        description="The checkpoint's preprocessor_config.json (multimodal models: image size limits "
        "for the encoder's memory profile).",
    )
    quantization_txt: str | None = Field(
        default=None,
        max_length=65536,
        description="The weight version's quantization.txt (its format tag, e.g. fp8 or awq): the "
        "quantization Preflight renders.",
    )
    checkpoint: Checkpoint = Field(
        default_factory=Checkpoint, description="How the weights are laid out on disk (merged or saved per rank)."
    )
    weights_bytes: Annotated[int, Field(ge=0, le=1 << 50, strict=True)] | None = Field(
        default=None,
        description="Total size of the weight files in bytes; when given, the memory model splits it "
        "instead of estimating from config.json.",
    )

    tensor_ranks: TensorRanks | None = Field(
        default=None,
        description="The checkpoint's bytes per decoder layer by vLLM's sharding, from its safetensors headers (a "
        "manifest's tensors.ranks); when given, the memory model uses it instead of the config.json estimate.",
    )

    tensor_linears: list[TensorLinear] | None = Field(
        default=None,
        max_length=1024,
        description="The checkpoint's linear module shapes from its safetensors headers (a manifest's "
        "tensors.linears); when given, the alignment rules read per-rank sizes, groups and blocks from them.",
    )

    @field_validator("preprocessor_config")
    @classmethod
    def _image_sizes(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        from .multimodal import size_problems

        problems = size_problems(v, "preprocessor_config")
        if problems:
            raise ValueError("; ".join(problems[:4]))
        return v


class CustomGpu(Strict):
    name: DisplayStr = Field(max_length=256, description="The GPU's name (as nvidia-smi prints it).")
    compute_capability: DisplayStr | float | None = Field(
        default=None, description='Compute capability, e.g. "9.0" (H100) or 8.9.'
    )
    memory_bytes: Annotated[int, Field(ge=1 << 30, le=1 << 42, strict=True)] | None = Field(
        default=None, description="Memory per GPU in bytes (as nvidia-smi reports its total)."
    )


class Hardware(Strict):
    """``gpu``: catalogue id, nvidia-smi name, or ``{"name", "compute_capability", "memory_bytes"}``;
    ``count``: GPUs per node; ``nodes``: number of nodes; ``interconnect``: ``nvlink``, ``pcie`` or null (unknown)."""

    gpu: DisplayStr | CustomGpu = Field(
        description="A GPU catalogue id (e.g. h100-sxm-80gb), the name nvidia-smi prints, or an inline GPU description."
    )
    count: Annotated[int, Field(ge=1, le=MAX_GPUS_PER_NODE, strict=True)] = Field(
        default=1, description="GPUs per node."
    )
    nodes: Annotated[int, Field(ge=1, le=MAX_NODES, strict=True)] = Field(
        default=1, description="Nodes one vLLM instance spans (multi-node: tensor or pipeline parallel across nodes)."
    )
    interconnect: Literal["nvlink", "pcie"] | None = Field(
        default=None,
        description="nvlink or pcie between the node's GPUs (judges tensor parallel over PCIe); unknown when left out.",
    )


class Workload(Strict):
    """Expected traffic, in tokens (prompt + output per request)."""

    avg_seq_len: Annotated[int, Field(ge=1, le=MAX_SEQ, strict=True)] | None = Field(
        default=None,
        description="Average tokens per request (prompt + output): sizes the max_num_seqs bound "
        "(docs/operating.md §5).",
    )
    p99_seq_len: Annotated[int, Field(ge=1, le=MAX_SEQ, strict=True)] | None = Field(
        default=None,
        description="P99 of tokens per request: sizes max_model_len (min(P99 × 1.2, the model's maximum), "
        "docs/operating.md §4).",
    )
    shape: Literal["long_in_short_out", "short_in_long_out", "balanced"] | None = Field(
        default=None,
        description="long_in_short_out, short_in_long_out or balanced: picks max_num_batched_tokens (4096, "
        "16384, 8192; docs/operating.md §6).",
    )
    stage: Literal["initial", "production"] | None = Field(
        default=None,
        description="initial (the conservative start: utilization 0.85, 0.5 × the max_num_seqs bound) or "
        "production (0.90, 0.75 × bound); docs/operating.md §9.",
    )


class LaunchRequest(Strict):
    """A requested launch of ``vllm serve`` on some hardware."""

    model: ModelSpec = Field(
        description="The model: its config.json (or a local path for the CLI), quantization tag, checkpoint"
        " layout, size."
    )
    hardware: Hardware = Field(description="The GPUs the launch runs on.")
    environment: Literal["production", "benchmark"] = Field(
        default="production",
        description=(
            "production or benchmark: the policy profile decides per environment which operators' rules refuse, "
            "warn or are off (the shipped one refuses gpu_memory_utilization above 0.95 and enforce_eager in "
            "production)."
        ),
    )
    workload: Workload | None = Field(
        default=None,
        description="Expected traffic; with it, left-out engine arguments are filled with recommended values.",
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="vllm serve options by name (max_model_len, --max-model-len or -tp spellings), with "
        "JSON values as vLLM's parser reads them.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables for the vLLM process (e.g. VLLM_ALLOW_LONG_MAX_MODEL_LEN).",
    )
    vllm_version: str | None = Field(
        default=None,
        max_length=32,
        description="The vLLM release the launch targets (default: the newest line Preflight knows).",
    )
    config_provenance: str | None = Field(
        default=None, max_length=8192, description="Free text: where the config.json came from (kept, not judged)."
    )

    @model_validator(mode="before")
    @classmethod
    def _plain_json(cls, data: Any) -> Any:
        check_json(data)  # finite numbers, safe integers, no NUL characters (see jsoncheck.py)
        return data

    @model_validator(mode="after")
    def _config_present(self) -> LaunchRequest:
        if self.model.config is None and self.model.path is None:
            raise ValueError("model needs config (the config.json object) or path (a model directory)")
        if len(self.engine_args) > 200:
            raise ValueError("engine_args has more than 200 entries")
        for key, value in self.env.items():
            if not ENV_NAME.fullmatch(key) or len(value) > 4096 or "\x00" in value:
                raise ValueError(
                    f"env: {key!r} is not a valid environment variable name (A-Z, 0-9, _) or its value is too long"
                )
        return self
