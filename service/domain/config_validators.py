"""What vLLM's config classes refuse in their own validators (pydantic ``field_validator`` / ``model_validator`` and
``__post_init__``), beyond the type, Enum and bound facts generated from each release's pydantic core schema
(config_values.py): the generator reads a field's schema and probes a field behind a ``before``/``wrap`` validator
only where the probes explain it (a name folded to an Enum member, None skipping validation); what it leaves, and
the wording vLLM's own validators give, are here.

Each check is vLLM's own condition, applied from the oldest release line whose source was read and found to make it
(``since``), with vLLM's message; it sees a value as pydantic's lax mode reads it (``"0"`` is 0 for a float field).
A condition that depends on something Preflight cannot see (the platform, a plugin, files) is left out: a false
reject is worse than a miss. ``option_problems`` is called by the flag rule (rules/flags.py ``validator_findings``)
before the generated facts, which judge what it leaves; every input is hostile, so a check never raises, it only
reports.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from packaging.version import InvalidVersion, Version

from .config_values import BadValue, _bool_problem, as_bool, as_float, as_int

Line = tuple[int, int]
Names = Mapping[str, Mapping[str, str]] | None  # the release's generated names (attention_backends, …) or None
Check = Callable[[Any, Line, Names], list[BadValue]]
MAX_PROBLEMS = 8

# ---------------------------------------------------------------------------------------------- CompilationConfig
# vllm 0.33.0 vllm/config/compilation.py:37-49 (CompilationMode, the same four members since 0.11.2
# compilation.py:36-43), 853-871 (validate_mode_before: a string is a member name, upper-cased; since 0.11.2
# compilation.py:563-580), 899-913 (None skips validation)
COMPILATION_MODES = ("NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE")


def _compilation(value: Any, line: Line, names: Names) -> list[BadValue]:
    if not isinstance(value, dict) or line < (0, 11) or value.get("mode") is None:
        return []
    mode = value["mode"]
    if isinstance(mode, str):
        if mode.upper() in COMPILATION_MODES:
            return []
        said = f"Value error, Invalid compilation mode: {mode}. Valid modes are: {', '.join(COMPILATION_MODES)}"
        return [BadValue("mode", mode, said, COMPILATION_MODES)]
    n, problem = as_int(mode)  # an IntEnum: pydantic reads the number (1.0 is 1)
    if (n is None and problem is None) or n in range(len(COMPILATION_MODES)):
        return []
    return [BadValue("mode", mode, "Input should be 0, 1, 2 or 3", (0, 1, 2, 3))]


# ------------------------------------------------------------------------------------------------ AttentionConfig
# vllm 0.33.0 vllm/config/attention.py:46, 240-264 (validate_backend_per_kind_before; since 0.26.0
# attention.py:23, 136-160); the kinds: vllm/v1/kv_cache_interface.py:183-193 KVCacheSpecKind (the same ten in
# 0.26.0 … 0.33.0); a string backend is AttentionBackendEnum[name.upper()], whose metaclass raises ValueError
# "Unknown attention backend" (vllm/v1/attention/backends/registry.py:18-31, since 0.26.0)
KV_CACHE_SPEC_KINDS = (
    "full_attention",
    "mla_attention",
    "sliding_window",
    "sliding_window_mla",
    "mamba",
    "chunked_local_attention",
    "sink_full_attention",
    "encoder_only_attention",
    "cross_attention",
    "unknown",
)


def in_definition_order(names: Mapping[str, str]) -> str:
    """Enum members as vLLM lists them: in the order the class defines them (the generated file:line)."""
    where = {n: loc.rpartition(":") for n, loc in names.items()}
    return ", ".join(sorted(names, key=lambda n: (where[n][0], int(where[n][2]) if where[n][2].isdigit() else 0)))


def _attention(value: Any, line: Line, names: Names) -> list[BadValue]:
    if not isinstance(value, dict) or line < (0, 26) or "backend_per_kind" not in value:
        return []
    per_kind = value["backend_per_kind"]
    if not isinstance(per_kind, dict):  # the validator hands it on; the dict field refuses it (None too)
        return [BadValue("backend_per_kind", per_kind, "Input should be an object")]
    backends = (names or {}).get("attention_backends")
    for kind, backend in per_kind.items():
        where = f"backend_per_kind.{kind}"
        if kind not in KV_CACHE_SPEC_KINDS:
            said = (
                f"Value error, Unknown KV cache group kind '{kind}' in backend_per_kind. Valid kinds are: "
                f"{', '.join(sorted(KV_CACHE_SPEC_KINDS))}."
            )
            return [BadValue(where, backend, said, KV_CACHE_SPEC_KINDS)]
        if (
            backend is None
        ):  # AttentionBackendEnum.CUSTOM (v1/attention/backends/registry.py:169): a plugin registers it
            continue
        if not isinstance(backend, str):
            return [BadValue(where, backend, "Input should be an AttentionBackendEnum member (by name)")]
        if backends is not None and backend.upper() not in backends:
            said = f"Value error, Unknown attention backend: '{backend.upper()}'. Valid options are: {in_definition_order(backends)}"
            return [BadValue(where, backend, said)]
    return []


# --------------------------------------------------------------------------- KVTransferConfig / ECTransferConfig
# vllm 0.33.0 vllm/config/kv_transfer.py:110-124 (since 0.6.6 config.py:2584-2587, "kv_disagg_role" up to 0.10.2
# kv_transfer.py:91-93); vllm/config/ec_transfer.py:80-95 (since 0.11.2 ec_transfer.py:91-95)
KV_ROLES = ("kv_producer", "kv_both", "kv_consumer")  # get_args of the nested Literal, flattened
EC_ROLES = ("ec_producer", "ec_both", "ec_consumer")


def _kv_transfer(value: Any, line: Line, names: Names) -> list[BadValue]:
    if not isinstance(value, dict) or value.get("kv_connector") is None or value.get("kv_role") is not None:
        return []
    role = "kv_role" if line >= (0, 11) else "kv_disagg_role"
    said = f"Value error, Please specify {role} when kv_connector is set, supported roles are {KV_ROLES}"
    return [BadValue("kv_role", value.get("kv_role"), said, KV_ROLES)]


def _ec_transfer(value: Any, line: Line, names: Names) -> list[BadValue]:
    if not isinstance(value, dict) or line < (0, 11) or value.get("ec_connector") is None:
        return []
    if value.get("ec_role") is not None:
        return []
    said = f"Value error, Please specify ec_role when ec_connector is set, supported roles are {EC_ROLES}"
    return [BadValue("ec_role", None, said, EC_ROLES)]


# ------------------------------------------------------------------------------------------------- ProfilerConfig
# vllm 0.33.0 vllm/config/profiler.py:214-307 (_validate_profiler_config; the same in 0.32.0). From older lines:
# the torch directory checks since 0.24.0 profiler.py:134-140, capture_torch_profiler since 0.26.0
# profiler.py:158, the Proton checks since 0.28.0 profiler.py:195-226 (proton_graph_attribution since 0.30.0),
# torch_profiler_activities since 0.32.0
_PROTON_DEFAULTS = (
    ("proton_profiler_dir", ""),
    ("proton_context", "shadow"),
    ("proton_data", "tree"),
    ("proton_backend", None),
    ("proton_mode", None),
    ("proton_hook", None),
    ("proton_output_format", None),
)


def _is_uri_path(path: str) -> bool:
    """vllm 0.33.0 vllm/config/profiler.py:52-63."""
    return "://" in path and len(path.split("://")[0]) > 1


Said = tuple[str, str] | None  # (the field vLLM's message is about, the message)


def _profiler_said(value: dict[str, Any], line: Line) -> Said:
    profiler = value.get("profiler")
    activities = value.get("torch_profiler_activities")
    if line >= (0, 32) and isinstance(activities, list):
        if profiler != "torch":
            return (
                "torch_profiler_activities",
                "torch_profiler_activities is only applicable when profiler is set to 'torch'",
            )
        if len(activities) != len({repr(a) for a in activities}):
            return "torch_profiler_activities", "torch_profiler_activities must not contain duplicates"
    torch_dir = value.get("torch_profiler_dir") or ""
    if line >= (0, 24) and torch_dir and profiler != "torch":
        return "torch_profiler_dir", "torch_profiler_dir is only applicable when profiler is set to 'torch'"
    if line >= (0, 24) and profiler == "torch" and not torch_dir:
        return "torch_profiler_dir", "torch_profiler_dir must be set when profiler is 'torch'"
    if line >= (0, 28):
        said = _proton_said(value, line)
        if said:
            return said
    if line >= (0, 26) and as_bool(value.get("capture_torch_profiler", False)) and profiler != "torch":
        return "capture_torch_profiler", "capture_torch_profiler is only applicable when profiler is set to 'torch'"
    return None


def _proton_said(value: dict[str, Any], line: Line) -> Said:
    profiler, proton_dir = value.get("profiler"), value.get("proton_profiler_dir") or ""
    graph = line >= (0, 30) and as_bool(value.get("proton_graph_attribution", False)) is True
    changed = [k for k, default in _PROTON_DEFAULTS if k in value and value[k] != default]
    changed += ["proton_graph_attribution"] if graph else []
    if profiler != "proton" and changed:
        return changed[0], f"{', '.join(changed)} only applicable when profiler is set to 'proton'"
    if profiler == "proton" and not proton_dir:
        return "proton_profiler_dir", "proton_profiler_dir must be set when profiler is 'proton'"
    if isinstance(proton_dir, str) and proton_dir and _is_uri_path(proton_dir):
        return "proton_profiler_dir", "proton_profiler_dir must be a local directory"
    if profiler != "proton":
        return None
    data, fmt, mode = value.get("proton_data", "tree"), value.get("proton_output_format"), value.get("proton_mode")
    if graph and data != "tree":
        return "proton_graph_attribution", "proton_graph_attribution requires proton_data='tree'"
    if graph and isinstance(mode, str) and mode.split(":", 1)[0].lower() == "periodic_flushing":
        return (
            "proton_graph_attribution",
            "proton_graph_attribution is incompatible with periodic_flushing: both manage Proton data phases.",
        )
    if fmt == "chrome_trace" and data != "trace":
        return "proton_output_format", "chrome_trace output requires proton_data='trace'"
    if fmt in ("hatchet", "hatchet_msgpack") and data != "tree":
        return "proton_output_format", f"{fmt} output requires proton_data='tree'"
    return None


def _profiler(value: Any, line: Line, names: Names) -> list[BadValue]:
    if not isinstance(value, dict) or line < (0, 24):
        return []
    said = _profiler_said(value, line)
    if said is None:
        return []
    key, text = said
    return [BadValue(key, value.get(key), f"Value error, {text}")]


# --------------------------------------------------------------------------------------------------- PoolerConfig
# vllm 0.33.0 vllm/config/pooler.py:60-80 (the bool fields), 139-151 (__post_init__: since 0.21.0 pooler.py:152-164;
# enable_flash_late_interaction since 0.32.0 pooler.py:66). The class's before model validator (pooler.py:126-137)
# leaves the generated catalogue without its fields' facts: the bool fields are judged here.
_POOLER_BOOLS: tuple[tuple[str, bool, Line], ...] = (
    ("use_activation", True, (0, 11)),
    ("enable_chunked_processing", False, (0, 18)),
    ("enable_flash_late_interaction", False, (0, 32)),
)


def _pooler(value: Any, line: Line, names: Names) -> list[BadValue]:
    if not isinstance(value, dict):
        return []
    out = []
    for key, null, since in _POOLER_BOOLS:
        v = value.get(key)
        if key in value and line >= since and not (v is None and null) and _bool_problem(v):
            out.append(BadValue(key, v, _bool_problem(v) or ""))
    if out or line < (0, 21):
        return out
    sigma, _ = as_float(value["logit_sigma"]) if value.get("logit_sigma") is not None else (None, None)
    if sigma == 0:
        return [
            BadValue("logit_sigma", value["logit_sigma"], "Value error, logit_sigma cannot be 0 (division by zero)")
        ]
    if value.get("pooling_type"):
        for other in ("seq_pooling_type", "tok_pooling_type"):
            if value.get(other) is not None:
                return [BadValue(other, value[other], f"Value error, Cannot set both `pooling_type` and `{other}`")]
    return []


# --------------------------------------------------------------------------------------------- IrOpPriorityConfig
# vllm 0.33.0 vllm/config/kernel.py:66-72 (_to_list_str, a before validator of every field; the same since 0.21.0
# kernel.py:61-68): a string is split at commas, a list must hold strings (an assert: pydantic's "Assertion
# failed"), anything not iterable raises TypeError, which argparse reports as "invalid parse_dataclass value"
# (vllm/engine/arg_utils.py:369-376); a dict's keys pass the assert and the list field refuses it.


def ir_op_priority_problems(value: Any, prefix: str = "") -> list[BadValue]:
    if not isinstance(value, dict):
        return []
    out = []
    for key, v in value.items():
        if isinstance(v, str):
            continue
        if isinstance(v, list):
            if not all(isinstance(x, str) for x in v):
                out.append(BadValue(f"{prefix}{key}", v, "Assertion failed (every entry must be a string)"))
        elif isinstance(v, dict):
            out.append(BadValue(f"{prefix}{key}", v, "Input should be a valid list"))
        else:
            out.append(BadValue(f"{prefix}{key}", v, "invalid parse_dataclass value (TypeError: not iterable)"))
    return out[:MAX_PROBLEMS]


def _ir_op_priority(value: Any, line: Line, names: Names) -> list[BadValue]:
    return ir_op_priority_problems(value) if line >= (0, 21) else []


def _kernel(value: Any, line: Line, names: Names) -> list[BadValue]:
    if not isinstance(value, dict) or line < (0, 21):
        return []
    return ir_op_priority_problems(value.get("ir_op_priority"), "ir_op_priority.")


# ---------------------------------------------------------------------------------------------- ObservabilityConfig
# vllm 0.33.0 vllm/config/observability.py:145-151 (packaging's parse; since 0.11.2 observability.py:84-90)


def _hidden_metrics_version(value: Any, line: Line, names: Names) -> list[BadValue]:
    if not isinstance(value, str) or line < (0, 11):
        return []
    try:
        Version(value)
    except InvalidVersion:
        return [BadValue("", value, f"Value error, Invalid version: {value!r}")]
    return []


# vllm 0.33.0 vllm/config/observability.py:167-214 (the same in 0.32.0, where the option came): booleans refused
# first, then the dict[str, list[float]] type, then the families (vllm/v1/metrics/buckets.py:13-27) and the bounds
BUCKET_FAMILY_KEYS = (
    "request_latency",
    "time_to_first_token",
    "inter_token_latency",
    "iteration_tokens",
    "request_params_n",
    "request_num_preemptions",
    "request_tokens",
    "kv_cache_residency",
)


def _histogram_types(value: dict[Any, Any]) -> list[BadValue]:
    for family, buckets in value.items():
        if isinstance(buckets, list) and any(isinstance(b, bool) for b in buckets):
            bound = next(b for b in buckets if isinstance(b, bool))
            said = f"Value error, custom_histogram_buckets[{family!r}]: bound {bound!r} must be a number, not a boolean"
            return [BadValue(str(family), buckets, said)]
    out = []
    for family, buckets in value.items():
        if not isinstance(buckets, list):
            out.append(BadValue(str(family), buckets, "Input should be a valid list"))
            continue
        for i, b in enumerate(buckets):
            problem = as_float(b)[1]
            if problem:
                out.append(BadValue(f"{family}[{i}]", b, problem))
    return out[:MAX_PROBLEMS]


def _histogram_buckets(value: Any, line: Line, names: Names) -> list[BadValue]:
    if value is None or line < (0, 32):
        return []
    if not isinstance(value, dict):
        return [BadValue("", value, "Input should be a valid dictionary")]
    typed = _histogram_types(value)
    if typed:
        return typed
    for family, buckets in value.items():
        where = f"custom_histogram_buckets[{family!r}]"
        if family not in BUCKET_FAMILY_KEYS:
            said = f"unknown bucket family {family!r}; known families: {sorted(BUCKET_FAMILY_KEYS)}"
            return [BadValue(str(family), buckets, f"Value error, custom_histogram_buckets: {said}")]
        if not buckets:
            return [BadValue(str(family), buckets, f"Value error, {where}: bucket list must not be empty")]
        bounds = [as_float(b)[0] for b in buckets]
        if any(x is None for x in bounds):  # a number too large to read: vLLM's own reading decides
            continue
        bad = next((x for x in bounds if x is not None and (not math.isfinite(x) or x <= 0)), None)
        if bad is not None:
            said = f"Value error, {where}: bound {bad!r} must be finite and greater than 0"
            return [BadValue(str(family), buckets, said)]
        if any(a >= b for a, b in zip(bounds, bounds[1:])):  # type: ignore[operator]
            said = f"Value error, {where}: bounds {bounds} must be strictly increasing"
            return [BadValue(str(family), buckets, said)]
    return []


# ------------------------------------------------------------------------------------------------- ParallelConfig
# vllm 0.33.0 vllm/config/parallel.py:255 (ge=1), 476-481 (a wrap validator: None skips the check; since 0.30.0
# parallel.py:440-445, where the option came)


def _elastic_ep_max_dp_size(value: Any, line: Line, names: Names) -> list[BadValue]:
    n, _ = as_int(value) if value is not None and line >= (0, 30) else (None, None)
    if n is None or n >= 1:
        return []
    return [BadValue("", value, "Input should be greater than or equal to 1", (1,))]


# dest -> (check, what vLLM's source says): JSON options judged per key, other options as a whole (path "")
CHECKS: dict[str, tuple[Check, str]] = {
    "compilation_config": (_compilation, "vllm 0.33.0 vllm/config/compilation.py:853-871, 899-913"),
    "attention_config": (_attention, "vllm 0.33.0 vllm/config/attention.py:240-264"),
    "kv_transfer_config": (_kv_transfer, "vllm 0.33.0 vllm/config/kv_transfer.py:110-124"),
    "ec_transfer_config": (_ec_transfer, "vllm 0.33.0 vllm/config/ec_transfer.py:80-95"),
    "profiler_config": (_profiler, "vllm 0.33.0 vllm/config/profiler.py:214-307"),
    "pooler_config": (_pooler, "vllm 0.33.0 vllm/config/pooler.py:60-80, 139-151"),
    "ir_op_priority": (_ir_op_priority, "vllm 0.33.0 vllm/config/kernel.py:66-72; engine/arg_utils.py:369-376"),
    "kernel_config": (_kernel, "vllm 0.33.0 vllm/config/kernel.py:66-72"),
    "show_hidden_metrics_for_version": (_hidden_metrics_version, "vllm 0.33.0 vllm/config/observability.py:145-151"),
    "custom_histogram_buckets": (_histogram_buckets, "vllm 0.33.0 vllm/config/observability.py:167-214"),
    "elastic_ep_max_dp_size": (_elastic_ep_max_dp_size, "vllm 0.33.0 vllm/config/parallel.py:255, 476-481"),
}


def option_problems(name: str, value: Any, line: Line, names: Names) -> tuple[list[BadValue], str]:
    """What the validators of the config class the option ``name`` is handed to refuse in ``value`` (paths inside
    the option; "" for the value itself), and the source; ``names``: the release's generated names, given only for
    a request of the generated release's own line (a later patch release may add a backend)."""
    found = CHECKS.get(name)
    if found is None or value is None:
        return [], ""
    check, source = found
    try:
        return check(value, line, names)[:MAX_PROBLEMS], source
    except (TypeError, ValueError, OverflowError, RecursionError):  # a hostile value this reading did not foresee
        return [], source
