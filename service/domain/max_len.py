"""The maximum model length each vLLM release derives from config.json (``_get_and_verify_max_len``), with the rope
scaling that release reads: what its config loader made of config.json's ``rope_scaling`` / ``rope_parameters``, and
what ``--hf-overrides`` and ``--rope-scaling`` replaced after (or before) that loader ran.

What differs between releases, each read from the release's wheel (paths under vllm/):

- the length keys and their minimum are the same in every release; a truthy ``model_max_length`` replaces the
  minimum from 0.8 (0.7.3 config.py:2481-2487 has no such step; 0.8.5 config.py:3013-3016; since 0.15 in
  transformers_utils/model_arch_config_convertor.py, 0.33.0 :374-407);
- the rope dict read: ``rope_scaling`` up to 0.11 (0.11.2 config/model.py:2080), ``rope_parameters`` (possibly one
  dict per layer type) from 0.13 (0.13.0 config/model.py:2114-2121), which the loader fills from ``rope_scaling``
  (Transformers 4: 0.13.0 transformers_utils/config.py:318-320; Transformers 5, installed by default from 0.21:
  ``convert_rope_params_to_dict`` / ``standardize_rope_params``);
- the rope factor multiplies the length for every rope type but su/longrope/llama3, and YaRN replaces the length by
  its ``original_max_position_embeddings`` first, up to 0.29 (0.28.0 config/model.py:2383-2413; 0.29.0 the same);
  from 0.30 YaRN and its DeepSeek variants leave the length alone (0.30.0 config/model.py:2466-2492, PR #56446);
- Gemma 3's length is never scaled from 0.8 (0.8.5 config.py:3049-3051);
- with ``max_model_len`` unset, a LongRoPE model starts at the top-level ``original_max_position_embeddings`` from
  0.11 (0.11.2 config/model.py:2110-2118); before, at the derived length;
- where overrides land: up to 0.9 every override is set on the loaded config after the loader normalised the rope
  dict (0.8.5 config.py:455-457; ``--rope-scaling`` joins them, 0.8.5 config.py:403-407), so an override's dict is
  read as given: without ``rope_type`` the derivation raises KeyError (vllm-project/vllm#10293); in 0.10 overrides go
  in before the loader (0.10.2 transformers_utils/config.py:601-608); from 0.11 an object-valued override is set
  after it (0.11.2 config/model.py:462-474, 514; 0.33.0 config/model.py:555-570, 617-629, 692). With Transformers 4
  (0.13-0.18) the derivation reads ``rope_parameters``, which the loader already copied from ``rope_scaling``: an
  ``rope_scaling`` override no longer reaches it. With Transformers 5 ``rope_scaling`` is an alias of
  ``rope_parameters`` whose setter standardises the dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .errors import DomainError
from .model_facts import LENGTH_KEYS, MAX_LENGTH, MAX_ROPE_FACTOR, config_int, config_number
from .versions import DEFAULT_VERSION, parse_version

ROPE_KEYS = ("rope_scaling", "rope_parameters")
DEFAULT_MAX_LEN = 2048  # every release: assumed when config.json has no length key (0.33.0 config/model.py:2577-2594)
NEVER_SCALING = ("su", "longrope", "llama3")
NEVER_SCALING_SINCE_030 = (*NEVER_SCALING, "yarn", "deepseek_yarn", "deepseek_llama_scaling")

# Where each generated line derives the length from the rope dict (``_get_and_verify_max_len``), for messages.
SITES = {
    "0.6.6": "vllm/config.py:2346-2368",
    "0.7.3": "vllm/config.py:2520-2542",
    "0.8.5": "vllm/config.py:3048-3072",
    "0.9.2": "vllm/config.py:3455-3479",
    "0.10.2": "vllm/config/__init__.py:2873-2897",
    "0.11.2": "vllm/config/model.py:2080-2104",
    "0.13.0": "vllm/config/model.py:2116-2139",
    "0.15.1": "vllm/config/model.py:1969-1990",
    "0.18.1": "vllm/config/model.py:2004-2034",
    "0.21.0": "vllm/config/model.py:2119-2149",
    "0.24.0": "vllm/config/model.py:2147-2177",
    "0.26.0": "vllm/config/model.py:2207-2237",
    "0.28.0": "vllm/config/model.py:2383-2413",
    "0.30.0": "vllm/config/model.py:2448-2492",
    "0.32.0": "vllm/config/model.py:2581-2616",
    "0.33.0": "vllm/config/model.py:2599-2634",
}


@dataclass(frozen=True)
class LengthRules:
    """How one release derives the maximum length (see the module docstring for each field's source)."""

    version: str
    model_max_length_wins: bool
    gemma3_unscaled: bool
    reads_rope_parameters: bool
    transformers_v5: bool
    transformers_v4_only: bool  # every Transformers the release allows is a 4.x (none fills a missing rope_type)
    overrides_before_loader: bool
    never_scaling: tuple[str, ...]
    longrope_default_original: bool
    top_level_original: bool

    @property
    def yarn_scales(self) -> bool:
        return "yarn" not in self.never_scaling

    @property
    def site(self) -> str:
        return f"vllm {self.version} {SITES.get(self.version, 'vllm/config/model.py _get_and_verify_max_len')}"


def _transformers_v4_only(version: str) -> bool:
    """Whether every Transformers the release's requirement allows is a 4.x (service/data/vllm/transformers/
    releases.json: its oldest and newest). A release that admits 5.x may run under it, whose config loading fills in
    a rope dict's missing rope_type (a launch that starts there is not refused); no data: 4.x as before."""
    from .transformers_models import release_transformers

    found = release_transformers(version)
    return found is None or all(v.split(".")[0] < "5" for v in found.versions)


@lru_cache(maxsize=64)
def length_rules(version: str = DEFAULT_VERSION) -> LengthRules:
    """The rules of the release ``version`` (a generated line's release: its facts are that line's)."""
    r = parse_version(version) or (0, 0, 0)
    return LengthRules(
        version=version,
        model_max_length_wins=r >= (0, 8, 0),
        gemma3_unscaled=r >= (0, 8, 0),
        reads_rope_parameters=r >= (0, 13, 0),
        transformers_v5=r >= (0, 21, 0),
        transformers_v4_only=_transformers_v4_only(version),
        overrides_before_loader=(0, 10, 0) <= r < (0, 11, 0),
        never_scaling=NEVER_SCALING_SINCE_030 if r >= (0, 30, 0) else NEVER_SCALING,
        longrope_default_original=r >= (0, 11, 0),
        top_level_original=r >= (0, 13, 0),
    )


@dataclass(frozen=True)
class LengthInput:
    """What the derivation needs beyond the (overridden) config.json: the release's rules and, for each rope key an
    override replaced in the text config, the value config.json itself held there."""

    rules: LengthRules
    overridden: dict[str, Any]


@dataclass(slots=True)  # built per plan: slots, not frozen (a frozen __init__ calls object.__setattr__ per field)
class MaxLen:
    """The release's derived maximum length (tokens) and how it came about."""

    derived: int
    key: str  # the length key vLLM names ("default" when config.json has none)
    default: int  # what the release uses when max_model_len is not given
    model_max_length: int | None
    rope_type: str | None  # the first rope type other than "default" (else "default", or None without rope)
    rope_factor: float | None  # that rope dict's factor, applied or not
    factor: float | None  # the rope factor the release multiplied by (None: not scaled)
    yarn_original: int | None  # the YaRN original_max_position_embeddings the release started from
    problems: tuple[str, ...]  # why the release fails reading the rope dict (KeyError, ValueError)
    ignored: tuple[str, ...]  # overridden rope keys the release does not read for the length
    site: str
    rope_key: str = "rope_scaling"  # the config key of the rope dict the release reads
    rope_field: str = "model.config.rope_scaling"  # that key's path in the request
    rope_as_given: bool = False  # read as an override gave it (not normalised by the release's loader)
    yarn_scales: bool = False  # the release starts YaRN from its original length and applies the factor (<= 0.29)

    def how(self) -> str:
        """The derivation in words, with numbers (empty when no rope factor was applied)."""
        if self.factor is None:
            return ""
        if self.yarn_original is not None:
            return (
                f"{self.site} derives {self.derived} from YaRN: original_max_position_embeddings "
                f"{self.yarn_original} × factor {self.factor:g}."
            )
        return f"{self.site} derives {self.derived} = {self.key} × rope factor {self.factor:g} ({self.rope_type})."


def _rope_source(text: dict[str, Any], length: LengthInput) -> tuple[str, Any, bool, tuple[str, ...]]:
    """``(key, value, as_given, ignored)``: the rope key and value the release derives from, whether it reads the
    value as an override gave it (not normalised by its loader), and the overridden keys it does not read."""
    rules, over = length.rules, length.overridden

    def before(key: str) -> Any:
        return over[key] if key in over else text.get(key)

    if not rules.reads_rope_parameters:
        given = "rope_scaling" in over and not rules.overrides_before_loader
        return "rope_scaling", text.get("rope_scaling"), given, tuple(k for k in over if k == "rope_parameters")
    if "rope_parameters" in over:
        return "rope_parameters", text.get("rope_parameters"), True, ()
    if not rules.transformers_v5:  # the loader copied config.json's rope_scaling; an override of it comes after
        key = "rope_scaling" if before("rope_scaling") is not None else "rope_parameters"
        return key, before(key), False, tuple(k for k in over if k == "rope_scaling")
    key = "rope_scaling" if text.get("rope_scaling") else "rope_parameters"
    return key, text.get(key), False, ()


def _dicts(value: dict[str, Any], field: str, nested_ok: bool) -> list[tuple[str, dict[str, Any]]]:
    """The rope dict, or its per-layer-type dicts (Transformers 5 nests them by layer type)."""
    if nested_ok and "rope_type" not in value and "type" not in value:
        nested = [(f"{field}.{k}", v) for k, v in value.items() if isinstance(v, dict)]
        if nested:
            return nested
    return [(field, value)]


def _normalised(
    d: dict[str, Any],
    field: str,
    as_given: bool,
    text: dict[str, Any],
    rules: LengthRules,
    problems: list[str],
    top_field: str,
) -> dict[str, Any]:
    """The rope dict as the release's loader leaves it (``type`` → ``rope_type``, su → longrope, mrope → default;
    original_max_position_embeddings from the top level from 0.13, or max_position_embeddings under Transformers 5)
    — unless the release reads it as given; what it then lacks is a problem."""
    rtype = d.get("rope_type")
    legacy = d.get("type")
    for name, v in (("rope_type", rtype), ("type", legacy)):
        if v is not None and not isinstance(v, str):
            raise DomainError(f"{field}.{name}", f"{field}.{name} must be a string", rule="config_invalid")
    out = dict(d)
    if rtype is None:
        if as_given or (legacy is None and not rules.transformers_v5 and rules.transformers_v4_only):
            what = f"The override of {field.rsplit('.', 1)[-1]}" if as_given else field
            problems.append(
                f"{what} has no 'rope_type'"
                + (f" (it gives the legacy 'type': {legacy!r})" if legacy else "")
                + f": {rules.site} reads rope_type and vLLM {rules.version} fails at start-up"
                + (
                    " with KeyError: an override is set after the loader that turns 'type' into 'rope_type'"
                    if as_given
                    else " (ValueError: rope_type is required)"
                )
            )
        rtype = legacy or "default"
    out["rope_type"] = {"su": "longrope", "mrope": "default"}.get(rtype, rtype) if not as_given else rtype
    if out["rope_type"] in ("yarn", "llama3", "longrope") and not as_given:
        top = text.get("original_max_position_embeddings")
        if rules.top_level_original and top:  # config.json's own key: a bad value is named there
            out["original_max_position_embeddings"] = config_int(top, top_field)
        elif rules.transformers_v5 and text.get("max_position_embeddings"):
            out.setdefault("original_max_position_embeddings", text.get("max_position_embeddings"))
    out["factor"] = config_number(out.get("factor"), field + ".factor", 0, MAX_ROPE_FACTOR)
    ompe = "original_max_position_embeddings"
    out[ompe] = config_int(out.get(ompe), f"{field}.{ompe}")
    return out


@dataclass(slots=True)  # built per plan: slots, not frozen (a frozen __init__ calls object.__setattr__ per field)
class RopeRead:
    """The rope dicts a release's derivation reads (normalised as its loader leaves them), the config field they
    come from, why the release would fail reading them, and the overridden rope keys it does not read."""

    dicts: list[dict[str, Any]]
    key: str
    field: str
    as_given: bool
    problems: list[str]
    ignored: tuple[str, ...]


def rope_read(text: dict[str, Any], length: LengthInput, prefix: str) -> RopeRead:
    """What the release's derivation reads of the text config's rope scaling (see ``RopeRead``)."""
    key, value, as_given, ignored = _rope_source(text, length)
    field = prefix + key
    if not value and not (as_given and value == {}):
        return RopeRead([], key, field, as_given, [], ignored)
    if not isinstance(value, dict):
        raise DomainError(field, f"{field} must be an object, got {type(value).__name__}", rule="config_invalid")
    problems: list[str] = []
    top_field = prefix + "original_max_position_embeddings"
    dicts = [
        _normalised(d, f, as_given, text, length.rules, problems, top_field)
        for f, d in _dicts(value, field, length.rules.reads_rope_parameters)
    ]
    return RopeRead(dicts, key, field, as_given, problems, ignored)


def _keys(text: dict[str, Any], prefix: str) -> tuple[list[tuple[int, str]], int | None]:
    found: list[tuple[int, str]] = []
    for k in LENGTH_KEYS:
        v = text.get(k)
        if v is not None and (type(v) is not int or not 0 <= v <= MAX_LENGTH):
            v = config_int(v, prefix + k)
        if v:
            found.append((v, k))
    return found, next((v for v, k in found if k == "model_max_length"), None)


def derive(
    text: dict[str, Any], model_type: str | None, prefix: str = "model.config.", length: LengthInput | None = None
) -> MaxLen:
    """The maximum length the release derives (``_get_and_verify_max_len`` up to the check): the smallest length key,
    ``model_max_length`` replacing it (0.8+), then the rope factor of a scaling rope type, YaRN starting from its
    original length up to 0.29; no length key → 2048. A length that is not an integer in [0, 2^40], or a scaled one
    beyond 2^40, is a DomainError naming the key."""
    length = length or LengthInput(length_rules(), {})
    rules = length.rules
    found, mml = _keys(text, prefix)
    rope = rope_read(text, length, prefix)
    factor, yarn = _scaling(rope, model_type, rules)
    first = next((d for d in rope.dicts if d["rope_type"] != "default"), rope.dicts[0] if rope.dicts else {})
    key, derived, default = "default", DEFAULT_MAX_LEN, DEFAULT_MAX_LEN
    if found:
        value, key = min(found)
        if mml and rules.model_max_length_wins:
            value, key = mml, "model_max_length"
        derived = value if yarn is None else yarn
        if factor is not None:
            derived = _scaled(derived, factor, key, rope.field)
        default = _default(text, rope, rules, derived)
    return MaxLen(
        derived=derived,
        key=key,
        default=default,
        model_max_length=mml,
        rope_type=first.get("rope_type"),
        rope_factor=first.get("factor"),
        factor=factor if found else None,
        yarn_original=yarn if found else None,
        problems=tuple(rope.problems),
        ignored=rope.ignored,
        site=rules.site,
        rope_key=rope.key,
        rope_field=rope.field,
        rope_as_given=rope.as_given,
        yarn_scales=rules.yarn_scales,
    )


def _scaled(length: int, factor: float, key: str, field: str) -> int:
    """``int(length × factor)``, as vLLM's derivation truncates it, within [1, 2^40] tokens: a factor that derives no
    token leaves max_model_len 0, and vLLM 0.33's scheduler config refuses the max_num_batched_tokens it fills from
    it (vllm 0.33.0 vllm/engine/arg_utils.py:3219-3224 min(max_num_seqs × max_model_len, …);
    vllm/config/scheduler.py:48 ge=1)."""
    scaled = length * factor
    if not 1 <= scaled <= MAX_LENGTH:
        raise DomainError(
            field + ".factor",
            f"rope scaling factor {factor:g} × {key} {length} is {scaled:g} tokens: the derived length must be "
            f"between 1 and {MAX_LENGTH} tokens",
            rule="config_out_of_range",
        )
    return int(scaled)


def _default(text: dict[str, Any], rope: RopeRead, rules: LengthRules, derived: int) -> int:
    """The length the release runs with when max_model_len is not given: the derived one, or from 0.11 a LongRoPE
    model's top-level original_max_position_embeddings (0.11.2 vllm/config/model.py:2110-2118)."""
    top = text.get("original_max_position_embeddings")
    longrope = any(d["rope_type"] == "longrope" for d in rope.dicts)
    if rules.longrope_default_original and longrope and type(top) is int and 0 < top <= MAX_LENGTH:
        return top
    return derived


def _scaling(rope: RopeRead, model_type: str | None, rules: LengthRules) -> tuple[float | None, int | None]:
    """``(factor, yarn original)``: the factor the release multiplies by (None: none applies) and the YaRN original
    length it starts from (None: the length key's value). As vLLM's loop: each scaling dict's factor replaces the
    last (a missing one keeps it; null counts as 1); YaRN's original_max_position_embeddings replaces the start up
    to 0.29 — where a YaRN dict lacks it the release raises KeyError (added to ``rope.problems``)."""
    if not rope.dicts or (rules.gemma3_unscaled and "gemma3" in (model_type or "")):
        return None, None
    factor: float | None = None
    yarn: int | None = None
    for d in rope.dicts:
        if d["rope_type"] in rules.never_scaling:
            continue
        factor = d["factor"] if d["factor"] is not None else (factor or 1.0)
        if d["rope_type"] == "yarn" and rules.yarn_scales:
            if d["original_max_position_embeddings"]:
                yarn = d["original_max_position_embeddings"]
            else:
                rope.problems.append(
                    f"{rope.field} declares YaRN without original_max_position_embeddings: {rules.site} starts "
                    f"the length from it and vLLM {rules.version} fails at start-up (KeyError)"
                )
    if factor == 1.0 and yarn is None:
        return None, None
    return factor, yarn
