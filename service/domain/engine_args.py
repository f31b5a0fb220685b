"""Engine arguments: the request's ``engine_args`` (vLLM names) parsed against the target release's own option
catalogue (service/domain/versions.py, generated from vLLM's parser), judged the way that parser judges a value.

- Keys are dest names (``max_model_len``), dashed names (``max-model-len``) or any spelling the release accepts
  (``--max-model-len``, ``-tp``); options the release does not have are kept aside for ``flag_unsupported``.
- A key that is no option but a unique prefix of one (``tensor-parallel`` → ``--tensor-parallel-size``) names that
  option, as the release's parser reads it (argparse ``allow_abbrev``, which FlexibleArgumentParser leaves on: vllm
  0.33.0 vllm/utils/argparse_utils.py:170-180); it is recorded for ``flag_abbreviated``, and a prefix of several
  option strings is kept aside for ``flag_unsupported`` (argparse: "ambiguous option").
- Values follow the option's kind: ``int``/``float`` as Python's ``int()``/``float()`` read them, human-readable
  sizes as ``human_readable_int`` (vllm 0.33.0 vllm/utils/argparse_utils.py:30-94: ``k/m/g`` powers of 10,
  ``K/M/G`` powers of 2, ``-1``/``auto`` for max_model_len), JSON options as objects (or their JSON text), list
  options (``nargs='+'``, append) as lists, booleans as JSON true/false.
- A value outside the option's ``choices`` is kept aside for ``flag_unsupported`` (with the allowed values); a value
  of the wrong type, or one that vLLM's parser would read as another option (it begins with ``-``), is bad input
  (DomainError → 422 naming ``engine_args.<name>``).
"""

from __future__ import annotations

import json
import math
import re
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

from .errors import DomainError
from .jsoncheck import JsonValueError, check_json
from .text import display_text_problem
from .versions import (
    DEST_NAME,
    K_BOOL,
    K_BOOL_VALUE,
    K_FLAG,
    K_FLOAT,
    K_INT,
    K_JSON,
    K_JSON_OR_STR,
    K_SIZE,
    K_SIZE_OR_AUTO,
    K_STR,
    Option,
    VersionLine,
)

_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
MAX_INT = 1 << 53
MAX_TEXT = 4096
MAX_LIST = 64
MAX_JSON_BYTES = 65536

# Range checks that mirror pydantic constraints in vLLM's config classes (ge=1 etc.); only where vLLM's own
# create_engine_config refuses the value (scripts/vllm_differential.py found 0.33 accepting num_gpu_blocks_override 0,
# data_parallel_size_local 0, max_cudagraph_capture_size -1, master_port 0 and block_size 100000, once refused here); gpu_memory_utilization's
# (0, 1] range is a *rule* (util_range), not bad input, so it is checked there.
_MIN = {
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "data_parallel_size": 1,
    "decode_context_parallel_size": 1,
    "max_num_seqs": 1,
    "max_num_batched_tokens": 1,
    "block_size": 1,
    "cpu_offload_gb": 0,
    "port": 1,
}
_MAX = {
    "tensor_parallel_size": 4096,
    "pipeline_parallel_size": 1024,
    "data_parallel_size": 4096,
    "port": 65535,  # the API server binds it (master_port is judged by the nnodes rule: multi-node only)
    "nnodes": 4096,
}
# Ranges judged by a rule with vLLM's own message (util_range), not refused as bad input
RULE_RANGES = {"gpu_memory_utilization"}
# Options whose value is the model or where it comes from: set by Preflight from the manifest, never by a request.
RESERVED = {"model": "the model comes from the manifest (its uri), rendered as vllm serve's positional argument"}

# number and name forms, as the parser reads them (compiled once: scalar() runs per engine argument)
_INT_TEXT = re.compile(r"-?\d{1,18}")
_SIZE_TEXT = re.compile(r"(\d{1,15}(?:\.\d{1,15})?)([kmgtKMGT])")
_NEG_INT_TEXT = re.compile(r"-\d{1,18}")
_INTEGER = re.compile(r"[+-]?\d{1,18}")
_DECIMAL = re.compile(r"[+-]?(\d{1,18}(\.\d{0,18})?|\.\d{1,18})([eE][+-]?\d{1,3})?")
_NAME = DEST_NAME


def parse_size(value: Any, name: str, auto: bool = False) -> int:
    """Parse an int or a human-readable size (``32k`` = 32000, ``32K`` = 32768, ``25.6k``; ``auto`` = -1 where
    the option accepts it)."""
    if isinstance(value, bool):
        raise DomainError(f"engine_args.{name}", f"{name} must be an integer, got {value!r}", rule="type")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        if value.isdigit() and value.isascii() and len(value) <= 18:
            return int(value)  # plain ASCII digits: what _INT_TEXT below matches
        text = value.strip()
        if auto and text.lower() == "auto":
            return -1
        if _INT_TEXT.fullmatch(text):
            return int(text)
        m = _SIZE_TEXT.fullmatch(text)
        if m and ("." not in m.group(1) or m.group(2).islower()):
            return int(float(m.group(1)) * _SUFFIX[m.group(2)])
    raise DomainError(
        f"engine_args.{name}", f"{name} must be an integer or a size like 32k / 32K, got {value!r}", rule="type"
    )


@dataclass
class EngineArgs:
    """The launch's engine arguments after parsing. ``given`` names what the request set explicitly;
    ``unsupported`` maps flags the target version does not accept to their raw values; ``bool_with_value`` lists
    boolean flags given a non-boolean value (``"False"``); ``bad_choice`` maps options given a value outside their
    ``choices`` to (value, choices); ``abbreviated`` and ``ambiguous`` the keys given as a prefix of an option."""

    values: dict[str, Any] = field(default_factory=dict)
    given: set[str] = field(default_factory=set)
    unsupported: dict[str, Any] = field(default_factory=dict)
    bool_with_value: dict[str, Any] = field(default_factory=dict)
    bad_choice: dict[str, tuple[Any, tuple[Any, ...]]] = field(default_factory=dict)
    bad_keys: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    # dest -> (the key as given, the option string it abbreviates); key -> (its option form, the strings it matches)
    abbreviated: dict[str, tuple[str, str]] = field(default_factory=dict)
    ambiguous: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)

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


def _clip(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."


def _text(name: str, value: Any, what: str = "a string") -> str:
    fld = f"engine_args.{name}"
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DomainError(fld, f"{name} must be {what}, got {value!r}", rule="type")
    text = value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)
    if len(text) > MAX_TEXT:
        raise DomainError(fld, f"{name} is too long ({len(text)} characters, more than {MAX_TEXT})", rule="range")
    bad = next((c for c in text if ord(c) < 32 and c != "\t"), None)
    if bad is not None:
        raise DomainError(fld, f"{name} holds a control character ({bad!r}): {_clip(text)!r}", rule="range")
    if text.startswith("-") and not _NEG_INT_TEXT.fullmatch(text):
        # vLLM's parser reads an element that begins with '-' as an option, and one that also holds a '.' as a dotted
        # key taking the next element as its value (vllm/utils/argparse_utils.py:460-486): only a negative integer
        # is read as a value
        raise DomainError(
            fld,
            f"{name} = {text!r} begins with '-': vLLM's parser would read it as an option, not as the value of "
            f"{flag(name)}",
            rule="argv_injection",
        )
    invisible = display_text_problem(text, allow_tab=True)
    if invisible:
        raise DomainError(
            fld, f"{name} {invisible}: the signed command would read differently from what runs", rule="argv_injection"
        )
    return text


def _number(name: str, value: Any, integer: bool) -> int | float:
    if integer and type(value) is str and value.isdigit() and value.isascii() and len(value) <= 18:
        return int(value)  # plain ASCII digits: what the _INTEGER match below accepts and int() reads, checks passed
    fld = f"engine_args.{name}"
    what = "an integer" if integer else "a number"
    if isinstance(value, bool):
        raise DomainError(fld, f"{name} must be {what}, got {value!r}", rule="type")
    if isinstance(value, str):
        text = value.strip()
        if not (_INTEGER if integer else _DECIMAL).fullmatch(text):
            raise DomainError(fld, f"{name} must be {what}, got {value!r}", rule="type")
        value = int(text) if integer else float(text)
    if not isinstance(value, (int, float)):
        raise DomainError(fld, f"{name} must be {what}, got {value!r}", rule="type")
    if isinstance(value, float) and not math.isfinite(value):
        raise DomainError(fld, f"{name} must be a finite number", rule="type")
    if integer:
        if isinstance(value, float) and not value.is_integer():
            raise DomainError(fld, f"{name} must be an integer, got {value!r}", rule="type")
        return int(value)
    out = float(value)
    if abs(out) > 1e6:
        raise DomainError(fld, f"{name} = {value!r} is absurd", rule="range")
    return out


DICT_ONLY = {"speculative_config"}  # a JSON option with no config class whose value vLLM reads as a dict


_QUOTED = re.compile(r'("(?:[^"\\]|\\.)*")')
_BARE_NUMBER = re.compile(r"\b\d+(?:\.\d+)?[kKmMgGtT]\b")


def expand_json_numbers(text: str, name: str) -> str:
    """Bare ``1k`` / ``2M`` tokens outside JSON strings replaced by their integers, as the parser of a config-class
    JSON option does before reading it (vllm 0.33.0 engine/arg_utils.py:302-321 ``_expand_json_human_readable_numbers``
    with ``human_readable_int``, utils/argparse_utils.py:30-74: ``k`` = 1000, ``K`` = 1024, no decimals with ``K``)."""
    parts = _QUOTED.split(text)
    for i in range(0, len(parts), 2):  # even indices: outside strings
        parts[i] = _BARE_NUMBER.sub(lambda m: str(parse_size(m.group(), name)), parts[i])
    return "".join(parts)


def _json(name: str, value: Any, opt: Option | None = None) -> Any:
    fld = f"engine_args.{name}"
    if isinstance(value, str) and opt is not None and opt.json_numbers:
        value = expand_json_numbers(value, name)
    if isinstance(value, str):
        try:  # NaN / Infinity / a 5,000-digit integer inside the text: the same bounds as the request body's JSON
            value = json.loads(value)
            check_json(value, fld)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, JsonValueError, int too long to convert
            if isinstance(e, JsonValueError):
                raise DomainError(fld, f"{e} (vLLM's JSON parsing would not carry it)", rule="type") from None
            raise DomainError(fld, f"{name} must be JSON (an object), got {value[:80]!r}", rule="type") from None
    if not isinstance(value, (dict, list)):
        raise DomainError(fld, f"{name} must be a JSON object, got {value!r}", rule="type")
    if isinstance(value, list) and name in DICT_ONLY:
        # vllm 0.33.0 vllm/engine/arg_utils.py:732 ``dict[str, Any] | None``, read with .items() (:2126-2128)
        raise DomainError(fld, f"{name} must be a JSON object (vLLM reads its keys), got a list", rule="type")
    if isinstance(value, list) and opt is not None and opt.json_keys:
        # a config class: pydantic validates a dataclass from an object only ("Input should be an object",
        # type=dataclass_type; vllm 0.33.0 vllm/engine/arg_utils.py:359-364 TypeAdapter(cls).validate_json)
        raise DomainError(fld, f"{name}: Input should be an object (a JSON list was given)", rule="type")
    if len(json.dumps(value)) > MAX_JSON_BYTES:
        raise DomainError(fld, f"{name} is larger than {MAX_JSON_BYTES} bytes of JSON", rule="range")
    return value


def scalar(name: str, opt: Option, value: Any) -> Any:
    """One value (not a list) of the option's kind, as the parser's ``type`` callable reads it."""
    kind = opt.kind
    if kind is K_INT:
        out = _number(name, value, integer=True)
    elif kind is K_SIZE or kind is K_SIZE_OR_AUTO:
        out = parse_size(value, name, auto=kind is K_SIZE_OR_AUTO)
        if kind is K_SIZE_OR_AUTO and out == -1:
            return -1
    elif kind is K_FLOAT:
        out = _number(name, value, integer=False)
        least = _MIN.get(name, 0.0)  # no vLLM float option takes a negative value; -x.y would read as a dotted key
        if out < least and name not in RULE_RANGES:
            raise DomainError(
                f"engine_args.{name}", f"{name} = {value!r} is out of range (must be >= {least})", rule="range"
            )
        return out
    elif kind is K_STR:
        return _text(name, value)
    elif kind is K_JSON:
        return _json(name, value, opt)
    elif kind is K_JSON_OR_STR:
        if isinstance(value, (dict, list)):
            return _json(name, value, opt)
        text = _text(name, value, "a JSON object or a string")
        # union_dict_and_str: text that looks like an object is parsed as JSON (vllm/engine/arg_utils.py:182-185)
        # a string that opens an object but is no JSON object fails vLLM's config validation as well
        return _json(name, text) if text.lstrip().startswith("{") else text
    else:  # pragma: no cover - BOOL/FLAG are handled by the caller
        raise AssertionError(kind)
    lo, hi = _MIN.get(name), _MAX.get(name, MAX_INT)
    if (lo is not None and out < lo) or out > hi or out < -1 or (out == -1 and lo is not None):
        bound = f">= {lo}" if lo is not None else "non-negative"
        raise DomainError(
            f"engine_args.{name}", f"{name} = {value!r} is out of range (must be {bound} and <= {hi})", rule="range"
        )
    return out


def _lora_module(name: str, item: Any) -> str:
    """One --lora-modules item as vLLM's LoRAParserAction reads it: ``name=path`` (with no comma) or a JSON object
    with ``name`` and ``path`` (and optionally ``base_model_name``) (vllm 0.33.0
    vllm/entrypoints/common/cli_args.py:38-69: anything else is "Invalid JSON format for --lora-modules")."""
    fld = f"engine_args.{name}"
    if isinstance(item, dict):
        allowed = {"name", "path", "base_model_name", "is_3d_lora_weight"}
        if (
            not {"name", "path"} <= set(item)
            or set(item) - allowed
            or not all(isinstance(item[k], str) for k in ("name", "path"))
        ):
            raise DomainError(
                fld,
                f"a {name} object needs string 'name' and 'path' (and optionally 'base_model_name'), got {item!r}",
                rule="type",
            )
        return json.dumps(item, separators=(",", ":"), sort_keys=True)
    text = _text(name, item)
    if "=" in text and "," not in text:
        lora, _, path = text.partition("=")
        if lora and path:
            return text
    elif text.lstrip().startswith("{"):
        _lora_module(name, _json(name, text))
        return text
    raise DomainError(
        fld,
        f"{name} items are 'name=path' or a JSON object with name and path; vLLM refuses "
        f"{text!r} ('Invalid JSON format for --lora-modules')",
        rule="type",
    )


def coerce(name: str, opt: Option, value: Any) -> Any:
    """One value as vLLM's parser would hold it after reading the rendered argv."""
    if opt.action == "LoRAParserAction":
        items = value if isinstance(value, list) else [value]
        if len(items) > MAX_LIST:
            raise DomainError(f"engine_args.{name}", f"{name} has more than {MAX_LIST} values", rule="range")
        return [_lora_module(name, v) for v in items]
    if opt.is_list:
        items = value if isinstance(value, list) else [value]
        if opt.kind is K_JSON and isinstance(value, list) and not opt.appends and opt.nargs is None:
            items = [value]
        if not items and opt.nargs == "+":
            raise DomainError(f"engine_args.{name}", f"{name} needs at least one value", rule="type")
        if len(items) > MAX_LIST:
            raise DomainError(f"engine_args.{name}", f"{name} has more than {MAX_LIST} values", rule="range")
        return [scalar(name, opt, v) for v in items]
    return scalar(name, opt, value)


def unknown_keys(
    value: dict[str, Any], schema: dict[str, Any], prefix: str = "", depth: int = 0
) -> tuple[str, tuple[str, ...]] | None:
    """The first key of a JSON value that the option's config dataclass does not have (vLLM's pydantic validation
    exits with "Unexpected keyword argument"), as (dotted path, the keys it allows)."""
    keys = schema.get("keys") or {}
    for k, v in value.items():
        if k not in keys:
            return prefix + str(k), tuple(sorted(keys))
        sub = keys[k]
        if sub and isinstance(v, dict) and depth < 8:
            found = unknown_keys(v, sub, f"{prefix}{k}.", depth + 1)
            if found:
                return found
    return None


def arg_name(key: object) -> str:
    """An ``engine_args`` key without its dashes: ``--max-model-len`` / ``max-model-len`` → ``max_model_len``
    (short spellings such as ``-tp`` need the release's catalogue: ``resolve_name``)."""
    return str(key).lstrip("-").replace("-", "_")


def flag(name: str) -> str:
    """The long option spelling of a dest: ``max_model_len`` → ``--max-model-len``."""
    return "--" + name.replace("_", "-")


def option_form(key: str) -> str:
    """The option string vLLM's parser looks up for an ``engine_args`` key: after ``--`` underscores become dashes
    (vllm 0.33.0 vllm/utils/argparse_utils.py:372-393; the same since 0.6, vllm 0.6.6 vllm/utils.py:1137-1147), a
    single-dash key as written, a bare name as its long option (``tensor_parallel`` → ``--tensor-parallel``)."""
    if key.startswith("--"):
        return "--" + key[2:].replace("_", "-")
    return key if key.startswith("-") else flag(key)


def abbreviations(spelled: str, line: VersionLine) -> tuple[str, ...]:
    """The option strings of the release's parser that ``spelled`` abbreviates, as Python's argparse finds them
    (3.12 argparse.py ``_get_option_tuples``): every string that begins with it, each counted (two spellings of one
    option make a prefix of both ambiguous as well). None where the parser refuses abbreviations (``allow_abbrev``
    off), or where a single-dash key begins with a short option (argparse reads ``-qfoo`` as ``-q foo``: a value
    inside the key, never a name). A bisection of the sorted strings: cheap enough to run for every unknown key."""
    if not line.allow_abbrev or len(spelled) < 2:
        return ()
    short = spelled[:2]
    if short[1] != "-" and (short in line.spellings or short in line.help_strings):
        return ()
    strings = line.parser_strings
    i = bisect_left(strings, spelled)
    j = i
    while j < len(strings) and strings[j].startswith(spelled):
        j += 1
    return strings[i:j]


def resolve_key(key: Any, line: VersionLine) -> tuple[str, tuple[str, ...]]:
    """The dest an ``engine_args`` key names and, when the key is an abbreviation, the option strings it matches:
    (dest, ()) for a name or spelling of an option (``max_model_len``, ``max-model-len``, ``--max-model-len``,
    ``-tp``); (dest, (option string,)) for a unique prefix (``tensor-parallel``); (name, matches) for a prefix of
    several (ambiguous) and (name, ()) for no option at all (both refused by ``flag_unsupported``)."""
    if key in line.dest_names:  # the usual spelling: what the steps below return unchanged
        return str(key), ()
    raw = str(key).strip()
    if raw.startswith("-") and raw in line.spellings:
        return line.spellings[raw], ()
    name = arg_name(raw)
    if not _NAME.fullmatch(name):
        raise DomainError(f"engine_args.{key}", f"{key!r} is not an engine argument name", rule="flag_name")
    spelled = flag(name)
    if name in line.options:
        return name, ()
    if spelled in line.spellings:
        return line.spellings[spelled], ()  # e.g. --no-enforce-eager given as a key
    matches = abbreviations(option_form(raw), line)
    if len(matches) == 1 and matches[0] in line.spellings:  # (a prefix of --help alone is no engine argument)
        return line.spellings[matches[0]], matches
    return name, matches if len(matches) > 1 else ()


def resolve_name(key: Any, line: VersionLine) -> str:
    """The dest an ``engine_args`` key names: ``max_model_len``, ``max-model-len``, ``--max-model-len``, ``-tp``,
    or a unique prefix of an option (``tensor-parallel``)."""
    return resolve_key(key, line)[0]


def dest_of(key: Any, line: VersionLine) -> str:
    """``resolve_name`` for code that only sorts keys (a key that names no option keeps its dashless form: parsing
    the launch reports it)."""
    try:
        return resolve_name(key, line)
    except DomainError:
        return arg_name(key)


def parse_engine_args(raw: dict[str, Any], line: VersionLine) -> EngineArgs:
    """Parse ``engine_args`` for one version line."""
    out = EngineArgs()
    for key, value in raw.items():
        name, matches = resolve_key(key, line)
        if len(matches) > 1:  # argparse: "ambiguous option: --x could match ..."
            out.ambiguous[str(key)] = (option_form(str(key).strip()), matches)
            continue
        if name in RESERVED:
            raise DomainError(
                f"engine_args.{key}", f"{key!r} cannot be set in engine_args: {RESERVED[name]}", rule="flag_reserved"
            )
        if name in out.given or name in out.unsupported or name in out.bool_with_value:
            raise DomainError(
                f"engine_args.{key}", f"{name} is given twice (as {key!r} and another spelling)", rule="flag_name"
            )
        opt = line.options.get(name)
        if opt is None:
            out.unsupported[name] = value
            continue
        if matches:
            out.abbreviated[name] = (str(key), matches[0])
        none_text = opt.optional and isinstance(value, str) and value in ("", "None")
        if none_text and opt.choices is not None and not opt.none_is_a_choice:
            # argparse checks the converted None against the choices: releases that list the string 'None' there
            # refuse it ("invalid choice: None"; vllm 0.13.0 vllm/engine/arg_utils.py:331-335), 0.33 lists None
            out.bad_choice[name] = (value, opt.choices)
            continue
        if value is None or none_text or (opt.appends and value == []):
            out.given.add(name)  # '' and 'None' parse to None for an optional option (arg_utils.py:173-179)
            out.values[name] = None
            continue
        if opt.kind is K_STR and opt.nargs == "?" and opt.const is True and isinstance(value, bool):
            if value:  # an optional-valued flag: the bare flag means True (vllm/engine/arg_utils.py:379-383)
                out.values[name] = True
                out.given.add(name)
            else:
                out.bool_with_value[name] = value
            continue
        if opt.kind is K_BOOL or opt.kind is K_FLAG or opt.kind is K_BOOL_VALUE:
            if not isinstance(value, bool):
                out.bool_with_value[name] = value
                continue
            spelled = matches[0] if matches else flag(arg_name(str(key).strip()))
            if spelled in opt.negative:  # {"no_enforce_eager": true} / {"no-enable-prefix": true}: the negative
                value = not value
            out.values[name] = value
            out.given.add(name)
            continue
        parsed = coerce(name, opt, value)
        if opt.json_keys and isinstance(parsed, dict):
            unknown = unknown_keys(parsed, opt.json_keys)
            if unknown:
                out.bad_keys[name] = unknown
                continue
        if opt.choices is not None:
            wrong = [
                v
                for v in (parsed if isinstance(parsed, list) else [parsed])
                if v not in opt.choices and str(v) not in {str(c) for c in opt.choices}
            ]
            if wrong:
                out.bad_choice[name] = (value, opt.choices)
                continue
        out.values[name] = parsed
        out.given.add(name)
    return out
