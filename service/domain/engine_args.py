"""Engine arguments: the request's ``engine_args`` (vLLM names) parsed against the target version's flag catalogue.

Values are checked for type and range (a wrong type or an absurd number is bad input → DomainError, a 422);
flags the version does not accept are kept aside for the ``flag_unsupported`` rule. Human-readable sizes follow
vLLM's parser (vllm 0.33.0 vllm/utils/argparse_utils.py:30-94): ``k/m/g`` powers of 10, ``K/M/G`` powers of 2,
``-1``/``auto`` for max_model_len auto-fit.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import DomainError
from .versions import Kind, VersionLine

_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
MAX_INT = 1 << 53

# Range checks that mirror pydantic constraints in vLLM's config classes (ge=1 etc.); gpu_memory_utilization's
# (0, 1] range is a *rule* (util_range), not bad input, so it is checked there.
_MIN = {
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "data_parallel_size": 1,
    "data_parallel_size_local": 1,
    "decode_context_parallel_size": 1,
    "nnodes": 1,
    "max_num_seqs": 1,
    "max_num_batched_tokens": 1,
    "block_size": 1,
    "cpu_offload_gb": 0,
    "num_gpu_blocks_override": 1,
    "max_cudagraph_capture_size": 0,
    "node_rank": 0,
    "port": 1,
    "master_port": 1,
}
_MAX = {"tensor_parallel_size": 4096, "pipeline_parallel_size": 1024, "data_parallel_size": 4096, "port": 65535,
        "master_port": 65535, "block_size": 4096, "nnodes": 4096}


def parse_size(value: Any, name: str) -> int:
    """Parse an int or a human-readable size (``32k`` = 32000, ``32K`` = 32768, ``25.6k``)."""
    if isinstance(value, bool):
        raise DomainError(f"engine_args.{name}", f"{name} must be an integer, got {value!r}", rule="type")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"-?\d+", text):
            return int(text)
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT])", text)
        if m and ("." not in m.group(1) or m.group(2).islower()):
            return int(float(m.group(1)) * _SUFFIX[m.group(2)])
    raise DomainError(f"engine_args.{name}", f"{name} must be an integer or a size like 32k / 32K, got {value!r}", rule="type")


@dataclass
class EngineArgs:
    """The launch's engine arguments after parsing. ``given`` names what the request set explicitly;
    ``unsupported`` maps flags the target version does not accept to their raw values; ``bool_with_value`` lists
    boolean flags given a non-boolean value (``"False"``)."""

    values: dict[str, Any] = field(default_factory=dict)
    given: set[str] = field(default_factory=set)
    unsupported: dict[str, Any] = field(default_factory=dict)
    bool_with_value: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        v = self.values.get(name)
        return default if v is None else v

    # Frequently used, with vLLM's defaults
    @property
    def tensor_parallel_size(self) -> int:
        return int(self.get("tensor_parallel_size", 1))

    @property
    def pipeline_parallel_size(self) -> int:
        return int(self.get("pipeline_parallel_size", 1))

    @property
    def data_parallel_size(self) -> int:
        return int(self.get("data_parallel_size", 1))

    @property
    def decode_context_parallel_size(self) -> int:
        return int(self.get("decode_context_parallel_size", 1))

    @property
    def world_size(self) -> int:
        """PP × TP (× PCP, always 1 here): vllm 0.33.0 vllm/config/parallel.py:964-968."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def enable_expert_parallel(self) -> bool:
        return bool(self.get("enable_expert_parallel", False))

    @property
    def enforce_eager(self) -> bool:
        return bool(self.get("enforce_eager", False))

    @property
    def trust_remote_code(self) -> bool:
        return bool(self.get("trust_remote_code", False))


def _coerce(name: str, kind: Kind, value: Any) -> Any:
    fld = f"engine_args.{name}"
    if value is None:
        return None
    if kind is Kind.BOOL:
        return value  # non-bools are judged by flag_unsupported (bool_with_value)
    if kind is Kind.INT:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise DomainError(fld, f"{name} must be an integer, got {value!r}", rule="type")
        try:
            f = float(value)
        except ValueError:
            raise DomainError(fld, f"{name} must be an integer, got {value!r}", rule="type") from None
        if not f.is_integer():
            raise DomainError(fld, f"{name} must be an integer, got {value!r}", rule="type")
        out = int(f)
    elif kind is Kind.SIZE:
        out = parse_size(value, name)
        if name == "max_model_len" and out == -1:
            return -1
    elif kind is Kind.FLOAT:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DomainError(fld, f"{name} must be a number, got {value!r}", rule="type")
        out = float(value)
        if out != out or out in (float("inf"), float("-inf")):
            raise DomainError(fld, f"{name} must be a finite number", rule="type")
        if abs(out) > 1e6:
            raise DomainError(fld, f"{name} = {value!r} is absurd", rule="range")
        return out
    elif kind is Kind.STR:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise DomainError(fld, f"{name} must be a string, got {value!r}", rule="type")
        text = str(value)
        if len(text) > 4096 or "\x00" in text:
            raise DomainError(fld, f"{name} is too long or contains NUL", rule="range")
        return text
    elif kind is Kind.STR_LIST:
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(i, str) and 0 < len(i) <= 512 for i in items) or len(items) > 32:
            raise DomainError(fld, f"{name} must be a string or a list of strings", rule="type")
        return items
    elif kind is Kind.JSON:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise DomainError(fld, f"{name} must be a JSON object", rule="type") from None
        if not isinstance(value, dict):
            raise DomainError(fld, f"{name} must be a JSON object", rule="type")
        return value
    else:  # pragma: no cover - exhaustive
        raise AssertionError(kind)
    lo, hi = _MIN.get(name), _MAX.get(name, MAX_INT)
    if (lo is not None and out < lo) or out > hi or out < -1:
        bound = f">= {lo}" if lo is not None else "non-negative"
        raise DomainError(fld, f"{name} = {value!r} is out of range (must be {bound} and <= {hi})", rule="range")
    return out


def parse_engine_args(raw: dict[str, Any], line: VersionLine) -> EngineArgs:
    """Parse ``engine_args`` for one version line. Dashes in keys are accepted as underscores (as vLLM does)."""
    out = EngineArgs()
    for key, value in raw.items():
        name = str(key).strip().lstrip("-").replace("-", "_")
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,80}", name):
            raise DomainError(f"engine_args.{key}", f"{key!r} is not an engine argument name", rule="flag_name")
        kind = line.kind(name)
        if kind is None:
            out.unsupported[name] = value
            continue
        if kind is Kind.BOOL and value is not None and not isinstance(value, bool):
            out.bool_with_value[name] = value
            continue
        out.values[name] = _coerce(name, kind, value)
        out.given.add(name)
    return out
