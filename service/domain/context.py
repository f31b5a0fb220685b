"""The launch context: a request resolved into typed facts (model, GPU, engine args, version) plus the effective
values vLLM 0.33 would derive for whatever the request leaves out. Rules read it; nothing here judges.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from .engine_args import EngineArgs, parse_engine_args
from .errors import DomainError
from .gpus import GIB, Gpu, resolve
from .max_len import ROPE_KEYS, LengthInput, length_rules
from .model_facts import ModelFacts, read_model_facts, text_config_of
from .quant_tag import QuantTag, parse_quantization_txt
from .request import LaunchRequest
from .versions import VersionLine, resolve_version

if TYPE_CHECKING:  # the memory model reads the context
    from .memory import Budget
    from .policy_profile import RulePolicy

_T = TypeVar("_T")


class _computed_once(Generic[_T]):
    """functools.cached_property without its lock (Python 3.11 takes an RLock on every first read, and a context
    lives in one thread): computed on first read, then stored in the instance dict, which shadows this
    non-data descriptor."""

    def __init__(self, func: Callable[[Any], _T]) -> None:
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _computed_once[_T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> _T | _computed_once[_T]:
        if obj is None:
            return self
        value = self.func(obj)
        obj.__dict__[self.name] = value
        return value


FP16_FORBIDDEN_MODEL_TYPES = {"gemma2", "gemma3", "gemma3_text", "glm4"}  # vllm/config/model.py:2397-2420
DTYPE_ALIASES = {
    "half": "float16",
    "float": "float32",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float32": "float32",
    "auto": "auto",
}


@dataclass(frozen=True)
class SchedulerDefaults:
    """vLLM 0.33's defaults for `vllm serve` by GPU tier (vllm 0.33.0 vllm/engine/arg_utils.py:2940-3039)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    tier: str


def scheduler_defaults(gpu: Gpu) -> SchedulerDefaults:
    """Tier by torch-reported total memory of device 0 and its name (vllm 0.33.0
    vllm/engine/arg_utils.py:2958-3006): ≥160 GiB → 16384/1024;
    ≥70 GiB and not an A100 → 8192/1024; else 2048/256. torch reports a few hundred MiB below nvidia-smi, which
    does not move any catalogue GPU across a tier boundary."""
    gib = gpu.memory_bytes / GIB
    if gib >= 160:
        return SchedulerDefaults(16384, 1024, ">=160 GiB")
    if gib >= 70 and "a100" not in gpu.name.lower() and "a100" not in gpu.id:
        return SchedulerDefaults(8192, 1024, ">=70 GiB, not A100")
    return SchedulerDefaults(2048, 256, "other (A100, L40S, A10, L4, RTX, ...)")


def platform_dtypes(gpu: Gpu) -> list[str]:
    """CUDA platform dtypes by capability (vllm 0.33.0 vllm/platforms/cuda.py:257-266)."""
    cc = gpu.compute_capability or (9, 0)  # AMD parts: treated as bf16-capable
    if cc >= (8, 0):
        return ["bfloat16", "float16", "float32"]
    if cc >= (6, 0):
        return ["float16", "float32"]
    return ["float32"]


def effective_dtype(requested: str, checkpoint: str | None, model_type: str | None, gpu: Gpu) -> str:
    """The dtype vLLM runs with (vllm 0.33.0 vllm/config/model.py:2423-2495). For ``auto``: candidates are the
    platform dtypes (minus float16 for gemma2/3/glm4); an fp32 checkpoint takes the first candidate; a supported
    checkpoint dtype is kept; otherwise the first candidate (the "Falling back" warning). An explicit dtype is kept
    (its problems are rules)."""
    req = DTYPE_ALIASES.get(requested, requested)
    if req != "auto":
        return req
    cands = [d for d in platform_dtypes(gpu) if not (d == "float16" and model_type in FP16_FORBIDDEN_MODEL_TYPES)]
    ckpt = checkpoint or "float32"
    if ckpt == "float32":
        return cands[0]
    if ckpt in cands:
        return ckpt
    return cands[0]


def effective_block_size(args: EngineArgs, facts: ModelFacts, gpu: Gpu) -> int:
    """The KV block size vLLM runs with: the user's, else 16 unless the MLA backend needs another — FlashInfer-MLA,
    the first MLA choice on SM100, takes 32; FlashAttn-MLA on SM90 stays 16 (vllm 0.33.0 vllm/config/cache.py:185,
    455-466; v1/attention/backends/mla/flashinfer_mla.py:205, flashattn_mla.py:50; platforms/cuda.py:96-155)."""
    given = args.get("block_size") if "block_size" in args.given else None
    if given is not None:  # an explicit null is vLLM's default (chosen by the backend)
        return int(given)
    cc = gpu.compute_capability
    if facts.is_mla and cc is not None and cc >= (10, 0):
        return 32
    return 16


@dataclass
class LaunchContext:
    """Everything a rule may read. Lengths in tokens, memory in bytes."""

    request: LaunchRequest
    facts: ModelFacts
    gpu: Gpu
    args: EngineArgs
    version: str
    line: VersionLine
    tag: QuantTag | None
    gpus_per_node: int
    nodes: int
    interconnect: str | None
    environment: str
    # effective values (vLLM defaults applied)
    max_model_len: int = 0
    max_model_len_auto: bool = False
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    enable_chunked_prefill: bool = True
    gpu_memory_utilization: float = 0.92
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    scheduler_tier: SchedulerDefaults | None = None
    budget: Budget | None = None  # filled by the validator
    # the policy profile's rules for this launch's environment (policy_profile.py), set by the validator
    policy: Mapping[str, RulePolicy] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    # read by most rules and every memory term: computed once (the engine arguments are not changed after parsing)
    @_computed_once
    def tp(self) -> int:
        return self.args.tensor_parallel_size

    @_computed_once
    def pp(self) -> int:
        return self.args.pipeline_parallel_size

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def checkpoint_quant(self) -> str | None:
        return self.facts.quant.method if self.facts.quant else None

    @_computed_once
    def requested_quantization(self) -> str | None:
        q = self.args.get("quantization")
        return q.lower() if isinstance(q, str) else None


def apply_hf_overrides(config: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """config.json as vLLM sees it with ``--hf-overrides`` (a JSON object): each key replaces the config's value,
    except that an object given for a nested config (``text_config``, ``vision_config``: a PretrainedConfig in
    Transformers) updates it key by key (vllm 0.33.0 vllm/config/model.py:555-570 ``_apply_dict_overrides``).
    Dict-valued attributes such as ``rope_scaling`` or ``quantization_config`` are replaced whole."""

    def merge(base: dict[str, Any], update: dict[str, Any], depth: int = 0) -> dict[str, Any]:
        out = dict(base)
        for key, value in update.items():
            nested = key.endswith("_config") and key != "quantization_config"
            if nested and isinstance(value, dict) and isinstance(out.get(key), dict) and depth < 8:
                out[key] = merge(out[key], value, depth + 1)
            else:
                out[key] = value
        return out

    return merge(config, overrides)


def _overridden_path(path: str, config: Any, overrides: dict[str, Any]) -> bool:
    """Whether the config value at ``path`` (``rope_scaling.factor``, ``text_config.num_hidden_layers``) is one the
    overrides set: a key they give, or inside an object they set whole (merged objects as apply_hf_overrides)."""
    base, over = config, overrides
    for part in path.split("."):
        key = part.split("[", 1)[0]
        if key not in over:
            return False
        value = over[key]
        merged = key.endswith("_config") and key != "quantization_config" and isinstance(value, dict)
        if not (merged and isinstance(base, dict) and isinstance(base.get(key), dict)):
            return True  # set whole: everything under it is the override's
        base, over = base[key], value
    return False


def _named_where_given(e: DomainError, config: Any, overrides: dict[str, Any], args: EngineArgs) -> DomainError:
    """A bad config value that --hf-overrides (or --rope-scaling, which joins them) set is named in engine_args."""
    head = "model.config."
    path = e.field[len(head) :]
    if not e.field.startswith(head) or not _overridden_path(path, config, overrides):
        return e
    top, *rest = path.split(".", 1)
    if top == "rope_scaling" and overrides[top] is args.values.get(top):  # --rope-scaling: the object itself
        option, where = "rope_scaling", ".".join(["engine_args.rope_scaling", *rest])
    else:
        option, where = "hf_overrides", f"engine_args.hf_overrides.{path}"
    message = f"{e.message.replace(e.field, where)} (set by --{option.replace('_', '-')})"
    return DomainError(where, message, rule=e.rule, accepted=e.accepted)


def release_overrides(args: EngineArgs, line: VersionLine) -> dict[str, Any]:
    """The config overrides the release applies: ``--hf-overrides`` (a JSON object), and up to 0.10
    ``--rope-scaling``, which joins them as ``{"rope_scaling": ...}`` after them (vllm 0.8.5 vllm/config.py:403-407;
    0.10.2 vllm/config/__init__.py:581-584); an empty object counts up to 0.8 (``is not None``) and is no override
    from 0.9 (0.9.2 vllm/config.py:490)."""
    given = args.values.get("hf_overrides")
    overrides = dict(given) if isinstance(given, dict) else {}
    rope = args.values.get("rope_scaling")
    if isinstance(rope, dict) and (rope or line.release < (0, 9, 0)) and "rope_scaling" in line.options:
        overrides["rope_scaling"] = rope
    return overrides


def _length_input(config: dict[str, Any], overrides: dict[str, Any], line: VersionLine) -> LengthInput:
    """The release's length rules and, for each rope key an override replaces in the text config, config.json's own
    value there (a release may read that one: service/domain/max_len.py)."""
    text = text_config_of(config)
    replaced: Any = overrides
    if text is not config:  # a text config is reached through its own key ({"text_config": {...}})
        key = next((k for k in ("text_config", "llm_config", "language_config") if config.get(k) is text), "")
        replaced = overrides.get(key) if isinstance(overrides.get(key), dict) else {}
    return LengthInput(length_rules(line.newest), {k: text.get(k) for k in ROPE_KEYS if k in replaced})


def build_context(req: LaunchRequest) -> LaunchContext:
    """Resolve a request. Raises DomainError for input that cannot be judged (unknown GPU, unsupported version,
    malformed config.json, bad quantization.txt, wrong engine-argument types)."""
    version, line = resolve_version(req.vllm_version)
    if req.model.config is None:
        raise DomainError("model.config", "model.config is required (the CLI reads it from model.path)")
    args = parse_engine_args(req.engine_args, line)
    config = req.model.config
    overrides = release_overrides(args, line)
    length = _length_input(config, overrides, line) if isinstance(config, dict) else None
    if overrides:
        config = apply_hf_overrides(config, overrides)
    try:
        facts = read_model_facts(config, req.model.hf_quant_config, line.length_defaults, length)
    except DomainError as e:
        raise _named_where_given(e, req.model.config, overrides, args) from None
    gpu = resolve(req.hardware.gpu if isinstance(req.hardware.gpu, str) else req.hardware.gpu.model_dump())
    tag = (
        parse_quantization_txt(req.model.quantization_txt, line.quant_methods)
        if req.model.quantization_txt is not None
        else None
    )
    ctx = LaunchContext(
        request=req,
        facts=facts,
        gpu=gpu,
        args=args,
        version=version,
        line=line,
        tag=tag,
        gpus_per_node=req.hardware.count,
        nodes=req.hardware.nodes,
        interconnect=req.hardware.interconnect,
        environment=req.environment,
    )
    _apply_defaults(ctx)
    return ctx


def _apply_defaults(ctx: LaunchContext) -> None:
    a = ctx.args
    mml = a.get("max_model_len")
    if mml is None or mml == -1:  # the release's default: the derived length, LongRoPE's original (max_len.py)
        ctx.max_model_len = ctx.facts.max_len.default if ctx.facts.max_len else ctx.facts.derived_max_model_len
        ctx.max_model_len_auto = mml == -1
    else:
        ctx.max_model_len = int(mml)
    ctx.gpu_memory_utilization = float(a.get("gpu_memory_utilization", ctx.line.default_gpu_memory_utilization))
    ctx.enable_chunked_prefill = bool(a.get("enable_chunked_prefill", True))
    ctx.dtype = effective_dtype(
        str(a.get("dtype", "auto")).lower(), ctx.facts.torch_dtype, ctx.facts.model_type, ctx.gpu
    )
    ctx.kv_cache_dtype = str(a.get("kv_cache_dtype", "auto")).lower()
    ctx.block_size = effective_block_size(a, ctx.facts, ctx.gpu)
    # scheduler defaults and post-processing (vllm 0.33.0 vllm/engine/arg_utils.py:3151-3240)
    tier = scheduler_defaults(ctx.gpu)
    ctx.scheduler_tier = tier
    user_mnbt, user_mns = a.get("max_num_batched_tokens"), a.get("max_num_seqs")
    mns = int(user_mns) if user_mns is not None else tier.max_num_seqs
    if user_mnbt is not None:
        mnbt = int(user_mnbt)
    else:
        mnbt = tier.max_num_batched_tokens
        if not ctx.enable_chunked_prefill:
            mnbt = max(ctx.max_model_len, mnbt)
        mnbt = min(mns * ctx.max_model_len, mnbt)
    if user_mns is None:
        mns = min(mns, mnbt)
    ctx.max_num_seqs, ctx.max_num_batched_tokens = mns, mnbt
