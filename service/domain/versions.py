"""Supported vLLM version lines, each described by data generated from that vLLM release itself.

``service/data/vllm/<release>.json`` is written by scripts/gen_vllm_catalogue.py from the release's wheel: every
``vllm serve`` option (dest, every spelling, action, value kind, nargs, choices, default), the model registry
(architectures and what their classes declare: SupportsPP, multimodal, hybrid, attention-free, pooling), the
architectures the release names as removed or moved to a plugin, quantization methods, KV-cache dtypes and the
defaults Preflight mirrors (gpu_memory_utilization, scheduler defaults by GPU). Nothing here is a hand-copied list
of vLLM facts: which flags or quantization methods a release removed follows from comparing the data of two lines.
Only the *advice* for a removal (what to use instead) is written by hand, in ``ADVICE``.

A requested version maps to the newest generated release whose major.minor is not newer (0.31.2 → the 0.30 line
when 0.31 is not generated); a version newer than every generated release, or older than the oldest, is refused
(``version_unsupported``). To add a line: ``python scripts/gen_vllm_catalogue.py X.Y.Z`` and commit the JSON.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from functools import cache, cached_property, lru_cache
from typing import Any

from .errors import DomainError
from .loading import LoadingFacts, read_facts

DATA_DIR = pathlib.Path(__file__).resolve().parent.parent / "data" / "vllm"


class Kind(str, Enum):
    """How vLLM's parser reads an option's value (scripts/vllm_catalogue_inside.py ``value_kind``)."""

    BOOL = "bool"  # BooleanOptionalAction / EnableDisableAction: --x / --no-x (or --enable-x / --disable-x)
    FLAG = "flag"  # store_true / store_const: the bare flag
    BOOL_VALUE = "bool_value"  # <= 0.7 StoreBoolean: --x true / --x false
    INT = "int"
    FLOAT = "float"
    STR = "str"
    JSON = "json"  # json.loads or a config dataclass parsed from JSON
    JSON_OR_STR = "json_or_str"  # a JSON object, or a plain string (union_dict_and_str)
    SIZE = "size"  # human_readable_int: 8k / 8K / 8192
    SIZE_OR_AUTO = "size_or_auto"  # human_readable_int_or_auto: also -1 / auto


# The members as plain module constants for the per-argument paths (engine_args.py, render.py): on Python 3.11 an
# attribute of an Enum class goes through EnumType's Python-level lookup (~60 ns a read; a constant ~10 ns).
K_BOOL, K_FLAG, K_BOOL_VALUE = Kind.BOOL, Kind.FLAG, Kind.BOOL_VALUE
K_INT, K_FLOAT, K_STR = Kind.INT, Kind.FLOAT, Kind.STR
K_JSON, K_JSON_OR_STR, K_SIZE, K_SIZE_OR_AUTO = Kind.JSON, Kind.JSON_OR_STR, Kind.SIZE, Kind.SIZE_OR_AUTO


@dataclass(frozen=True)
class Option:
    """One ``vllm serve`` option as the release's parser defines it."""

    dest: str
    spellings: tuple[str, ...]
    negative: tuple[str, ...]
    kind: Kind
    nargs: Any
    choices: tuple[Any, ...] | None
    default: Any
    const: Any
    optional: bool  # '' and 'None' parse to None
    action: str
    deprecated: bool
    help: str
    json_keys: dict[str, Any] | None = None  # for a config-dataclass JSON option: {"keys": {field: sub-schema or None}}
    json_numbers: bool = False  # the parser expands bare 1k / 2M tokens in the option's JSON before reading it
    # and, where the generator read them, "class" and "values": {field: value facts} (service/domain/config_values.py)
    value_facts: dict[str, Any] | None = None  # the facts of the config field EngineArgs hands the value to unchanged
    # the parser's choices hold None itself (not the text 'None'): what '' / 'None' convert to is a valid choice
    none_is_a_choice: bool = False

    @cached_property
    def flag(self) -> str:
        """The spelling Preflight renders: the first long positive spelling."""
        positives = [s for s in self.spellings if s not in self.negative]
        own = "--" + self.dest.replace("_", "-")
        if own in positives:  # --gpu-memory-utilization, not its alias --device-memory-utilization
            return own
        longs = [s for s in positives if s.startswith("--")]
        return (longs or positives or [own])[0]

    @cached_property
    def negative_flag(self) -> str | None:
        if not self.negative:
            return None
        plain = [s for s in self.negative if not s.startswith("--no-")]
        return (plain or list(self.negative))[0]

    @cached_property
    def is_list(self) -> bool:
        """Takes several values: ``nargs`` '+' / '*' or an int, or an append action (repeated flag)."""
        return self.nargs in ("+", "*") or (isinstance(self.nargs, int) and self.nargs > 1) or self.appends

    @cached_property
    def appends(self) -> bool:
        return self.action in ("_AppendAction",)


@dataclass(frozen=True)
class RemovedFlag:
    """A flag an older generated line has and this one lacks: ``last_seen`` is the newest line that has it,
    ``removed_in`` the first generated line without it (the removal happened in between)."""

    removed_in: str
    advice: str
    source: str
    last_seen: str = ""

    @property
    def when(self) -> str:
        return (
            f"after vLLM {self.last_seen} (gone by {self.removed_in})"
            if self.last_seen
            else f"in vLLM {self.removed_in}"
        )


@dataclass(frozen=True)
class Architecture:
    name: str
    supports_pp: bool | None  # None: the class could not be read from the source; never a reason to refuse
    multimodal: bool
    hybrid: bool
    attention_free: bool
    pooling_only: bool
    generate: bool
    # the class implements SupportsLoRA (None: not read); a draft-only class is never asked (vLLM skips drafters)
    supports_lora: bool | None = None
    draft_only: bool = False
    # the class implements SupportsMambaPrefixCaching (None: not read, or a catalogue generated before it was read)
    supports_mamba_prefix_caching: bool | None = None
    supports_hc_sp: bool | None = None  # implements SupportsHCSP (None: not read)


# an engine_args key naming a dest (engine_args.resolve_name)
DEST_NAME = re.compile(r"[a-z][a-z0-9_]{0,80}")


@dataclass(frozen=True)
class VersionLine:
    """One supported vLLM release line (``0.33`` covers 0.33.x), from the release ``newest``'s generated data."""

    line: str
    newest: str
    options: dict[str, Option]
    spellings: dict[str, str]  # every accepted option string (--x-y, --no-x-y, -tp, ...) -> dest
    quant_methods: tuple[str, ...]
    deprecated_quant: tuple[str, ...]
    kv_cache_dtypes: tuple[str, ...]
    architectures: dict[str, Architecture]
    previously_supported: dict[str, str]
    out_of_tree: dict[str, str]
    scheduler_by_gpu: dict[str, dict[str, Any]] | None
    default_gpu_memory_utilization: float
    source: dict[str, str]
    length_defaults: dict[str, dict[str, int]] = field(default_factory=dict)
    # per quantization method, what its config class returns as constants: min_capability (e.g. 75) and
    # act_dtypes (torch dtype names); absent where the class computes them at run time
    quant_details: dict[str, dict[str, Any]] = field(default_factory=dict)
    # what each option, nested JSON field and env variable can make the release load (service/domain/loading.py)
    loading: LoadingFacts = field(default_factory=LoadingFacts)
    # whether the release's vllm serve parser reads a unique prefix of a long option as that option (argparse's
    # allow_abbrev, generated by scripts/vllm_argparse.py: false when the catalogue does not say), the option strings
    # argparse adds besides the catalogue's (-h/--help) and where the release defines the parser
    allow_abbrev: bool = False
    help_strings: tuple[str, ...] = ()
    parser_source: str = ""

    @cached_property
    def release(self) -> tuple[int, int, int]:
        return parse_version(self.newest) or (0, 0, 0)

    @cached_property
    def removed(self) -> dict[str, RemovedFlag]:
        """The flags an older generated line has and this one lacks (read from the older lines when first asked:
        only a request naming an option this line does not have needs them)."""
        return _removals(self)[0]

    @cached_property
    def plugin_only(self) -> dict[str, tuple[str, str]]:
        """Quantization methods an older generated line has and this one lacks: (first line without, advice)."""
        return _removals(self)[1]

    @cached_property
    def names(self) -> dict[str, dict[str, str]]:
        """The names the release accepts where a value is looked up in a registry or an enum: ``reasoning_parsers``,
        ``tool_parsers``, ``attention_backends``, ``mamba_backends`` -> {name: file:line}, read on first use from
        ``names/<release>.json`` (scripts/vllm_names.py); a kind the release lacks (or a missing file) is absent."""
        path = DATA_DIR / "names" / f"{self.newest}.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        return {k: v for k, v in data.items() if isinstance(v, dict) and k != "source"}

    @property
    def flags(self) -> dict[str, Option]:
        return self.options

    @cached_property
    def parser_strings(self) -> tuple[str, ...]:
        """Every option string of the release's vllm serve parser, sorted (the help strings included: argparse
        matches an abbreviation against them too); engine_args.abbreviations bisects it."""
        return tuple(sorted({*self.spellings, *self.help_strings}))

    @cached_property
    def option_names(self) -> tuple[str, ...]:
        return tuple(self.options)

    @cached_property
    def dest_names(self) -> frozenset[str]:
        """The option dests that are engine_args keys as written (``max_model_len``): engine_args.resolve_name
        returns such a key unchanged, so it looks them up first (built once per line)."""
        return frozenset(n for n in self.options if DEST_NAME.fullmatch(n))

    def kind(self, name: str) -> Kind | None:
        opt = self.options.get(name)
        return opt.kind if opt else None

    def option(self, name: str) -> Option | None:
        return self.options.get(name)


# Hand-written advice for what a removal means (the removal itself follows from the data). Keyed by dest.
ADVICE: dict[str, tuple[str, str]] = {
    "swap_space": ("drop it: the V1 engine has no CPU swap space", "vllm-project/vllm#36216"),
    "rope_scaling": ("use --hf-overrides '{\"rope_parameters\": {...}}'", "vllm-project/recipes#856"),
    "rope_theta": ("use --hf-overrides '{\"rope_parameters\": {...}}'", "vllm-project/recipes#856"),
    "override_attention_dtype": ("drop it", "runpod-workers/worker-vllm#332"),
    "calculate_kv_scales": ("drop it", "runpod-workers/worker-vllm#332"),
    "task": (
        "use --runner / --convert; vllm serve has no --task",
        "vllm/utils/argparse_utils.py (FlexibleArgumentParser.error)",
    ),
    "disable_log_requests": ("use --enable-log-requests / --no-enable-log-requests", "vllm/engine/arg_utils.py"),
    "use_v2_block_manager": ("drop it: the only block manager since 0.6", "vllm/engine/arg_utils.py"),
}
# Quantization methods that left vLLM core for a plugin (advice text; which line dropped them follows from the data)
QUANT_PLUGINS: dict[str, str] = {
    "bitsandbytes": "vllm-bnb-plugin (vllm-project/vllm#43529)",
    "gguf": "vllm-gguf-plugin (vllm-project/vllm#39612)",
}


# X.Y[.Z[.W…]] (PEP 440 release segments, ASCII digits only: vLLM published 0.10.1.1; segments past the third are kept
# out of the triple) with pre/post/dev suffixes (the number may be implicit: 0.6.4.post2.dev, 0.8.5.dev) and a local
# part (0.6.3.dev114+g4f95ffee, 0.8.5.post1, 0.11.0rc2)
_VERSION = re.compile(
    r"v?(?P<release>\d{1,4}\.\d{1,4}(?:\.\d{1,6}){0,4})"
    r"(?P<rest>(?:\.?(?:post|dev|rc|a|b)\d{0,9})*(?:\+[A-Za-z0-9]+(?:\.[A-Za-z0-9]+)*)?)",
    re.ASCII,
)


def _version_parts(text: str) -> tuple[list[int], str] | None:
    m = _VERSION.fullmatch(text.strip())
    if not m:
        return None
    return [int(x) for x in m["release"].split(".")], m["rest"]


def parse_version(text: str) -> tuple[int, int, int] | None:
    parts = _version_parts(text)
    if parts is None:
        return None
    release = parts[0] + [0] * (3 - len(parts[0]))
    return release[0], release[1], release[2]


MAX_VERSION_CHARS = 32  # what a plan stores (Plan.vllm_version)


def canonical_version(text: str) -> str | None:
    """One spelling per version, as signed into a plan: PEP 440's normal form (packaging) with at least three
    release segments (``v0.26.0`` → ``0.26.0``, ``00.33`` → ``0.33.0``, ``0.33rc01`` → ``0.33.0rc1``,
    ``0.33.0post1`` → ``0.33.0.post1``, ``0.10.1.1`` unchanged); None when it is not a version."""
    from packaging.version import InvalidVersion, Version

    if _version_parts(text) is None:  # ASCII digits, bounded segments: checked before packaging reads it
        return None
    try:
        v = Version(text.strip())
    except InvalidVersion:
        return None
    out = ".".join(str(x) for x in list(v.release) + [0] * (3 - len(v.release)))
    if v.pre is not None:
        out += f"{v.pre[0]}{v.pre[1]}"
    if v.post is not None:
        out += f".post{v.post}"
    if v.dev is not None:
        out += f".dev{v.dev}"
    if v.local is not None:
        out += f"+{v.local}"
    return out


def _option(raw: dict[str, Any]) -> Option:
    choices = raw.get("choices")
    return Option(
        dest=raw["dest"],
        spellings=tuple(raw["option_strings"]),
        negative=tuple(raw.get("negative_option_strings") or ()),
        kind=Kind(raw["kind"]),
        nargs=raw.get("nargs"),
        choices=tuple(c for c in choices if c is not None) if choices else None,
        default=raw.get("default"),
        const=raw.get("const"),
        optional=bool(raw.get("optional")),
        action=raw.get("action", ""),
        deprecated=bool(raw.get("deprecated")),
        help=raw.get("help", ""),
        json_keys=raw.get("json_keys"),
        json_numbers=bool(raw.get("json_numbers")),
        value_facts=raw.get("value_facts"),
        none_is_a_choice=isinstance(choices, list) and None in choices,
    )


def _load(path: pathlib.Path) -> VersionLine:
    data = json.loads(path.read_text())
    options = {o["dest"]: _option(o) for o in data["options"]}
    spellings = {s: o.dest for o in options.values() for s in o.spellings}
    reg = data["registry"]
    archs = {
        name: Architecture(
            name,
            a.get("supports_pp"),
            bool(a.get("multimodal")),
            bool(a.get("hybrid")),
            bool(a.get("attention_free")),
            bool(a.get("pooling_only")),
            bool(a.get("generate")),
            a.get("supports_lora") if a.get("resolved", True) else None,
            bool(a.get("draft_only")),
            a.get("supports_mamba_prefix_caching") if a.get("resolved", True) else None,
            a.get("supports_hc_sp") if a.get("resolved", True) else None,
        )
        for name, a in reg["architectures"].items()
    }
    version = data["vllm_version"]
    major, minor, _ = parse_version(version) or (0, 0, 0)
    gmu = options.get("gpu_memory_utilization")
    parser = data.get("argparse") or {}
    kv = data.get("kv_cache_dtypes") or []
    if not kv and options.get("kv_cache_dtype") and options["kv_cache_dtype"].choices:
        kv = list(options["kv_cache_dtype"].choices)
    return VersionLine(
        line=f"{major}.{minor}",
        newest=version,
        options=options,
        spellings=spellings,
        quant_methods=tuple(data["quantization"]["methods"]),
        deprecated_quant=tuple(data["quantization"].get("deprecated") or ()),
        kv_cache_dtypes=tuple(kv),
        architectures=archs,
        previously_supported=dict(reg.get("previously_supported") or {}),
        out_of_tree=dict(reg.get("out_of_tree") or {}),
        scheduler_by_gpu=(data.get("defaults") or {}).get("scheduler_by_gpu"),
        default_gpu_memory_utilization=float(gmu.default) if gmu and isinstance(gmu.default, (int, float)) else 0.9,
        source={"vllm_version": version, **data.get("source", {})},
        length_defaults=(data.get("transformers_length_defaults") or {}).get("by_model_type") or {},
        quant_details={
            m: {k: v for k, v in d.items() if k in ("min_capability", "act_dtypes") and v is not None}
            for m, d in (data["quantization"].get("details") or {}).items()
        },
        loading=_loading(version),
        allow_abbrev=parser.get("allow_abbrev") is True,
        help_strings=tuple(parser.get("help_option_strings") or ()),
        parser_source=parser.get("parser_init", ""),
    )


@cache
def _catalogue_files() -> tuple[tuple[tuple[int, int, int], str, pathlib.Path], ...]:
    """(release, version, path) of every generated line, oldest first, from the file names alone
    (``<vllm_version>.json``): which lines exist is known without reading any of them."""
    found = []
    for path in DATA_DIR.glob("*.json"):
        release = parse_version(path.stem)
        if release is not None:
            found.append((release, path.stem, path))
    return tuple(sorted(found))


@cache
def _loading(version: str) -> LoadingFacts:
    """The release's loading facts (``loading/<version>.json``, generated beside its catalogue); none when absent."""
    path = DATA_DIR / "loading" / f"{version}.json"
    return read_facts(json.loads(path.read_text())) if path.exists() else LoadingFacts()


@cache
def _line(version: str) -> VersionLine:
    """One generated line, read on first use and kept (a check of one request reads one file of the 16)."""
    return _load(DATA_DIR / f"{version}.json")


@cache
def _lines() -> tuple[VersionLine, ...]:
    """Every generated line, oldest first."""
    return tuple(_line(version) for _, version, _ in _catalogue_files())


def _removals(line: VersionLine) -> tuple[dict[str, RemovedFlag], dict[str, tuple[str, str]]]:
    """The flags and quantization methods ``line`` lacks that an older line has (only older lines decide it: the
    newest older line with a flag is followed by lines without it up to ``line``)."""
    loaded = [l for l in _lines() if l.release <= line.release]
    seen_flags: dict[str, str] = {}  # dest -> newest older line that had it
    seen_quant: dict[str, str] = {}
    for older in loaded:
        if older.release >= line.release:
            break
        for dest in older.options:
            seen_flags[dest] = older.newest
        for m in older.quant_methods:
            seen_quant[m] = older.newest
    removed = {}
    for dest, last in seen_flags.items():
        if dest not in line.options:
            advice, source = ADVICE.get(dest, ("drop it", f"service/data/vllm/{last}.json vs {line.newest}.json"))
            removed[dest] = RemovedFlag(
                _first_without(loaded, last, lambda l: dest in l.options),  # noqa: B023 - called at once
                advice,
                source,
                last,
            )
    plugin_only = {}
    for method, last in seen_quant.items():
        if method not in line.quant_methods:
            plugin_only[method] = (
                _first_without(loaded, last, lambda l: method in l.quant_methods),  # noqa: B023 - called at once
                QUANT_PLUGINS.get(method, f"vLLM {last} or older (the newest generated line that still has it)"),
            )
    return removed, plugin_only


def _first_without(lines: list[VersionLine], last_with: str, has: Callable[[VersionLine], bool]) -> str:
    """The first line after ``last_with`` for which ``has(line)`` is false (the line that no longer has it)."""
    after = [l for l in lines if l.release > (parse_version(last_with) or (0, 0, 0))]
    return next((l.newest for l in after if not has(l)), after[0].newest if after else last_with)


def version_lines() -> tuple[VersionLine, ...]:
    return _lines()


def newest_line() -> VersionLine:
    return _line(_catalogue_files()[-1][1])


DEFAULT_VERSION = "0.33.0"


@cache
def env_loading() -> LoadingFacts:
    """The env facts of every supported line in one: a variable that loads in any line is judged as loading (a plan
    names its release, but the node's env outlives it)."""
    env: dict[str, frozenset[str]] = {}
    sites: dict[str, str] = {}
    names: set[str] = set()
    for _, version, _ in reversed(_catalogue_files()):  # the loading files alone, newest first: a few KB each
        facts = _loading(version)
        names |= facts.env_names
        for name, kinds in facts.env.items():
            env[name] = env.get(name, frozenset()) | kinds
            sites.setdefault(name, f"vllm {version} {facts.env_sites.get(name, '')}".strip())
    return LoadingFacts(env=env, env_sites=sites, env_names=frozenset(names))


@cache
def all_quant_methods() -> tuple[str, ...]:
    """Every quantization method name of any supported line: what a manifest's quantization.txt may name."""
    return tuple(dict.fromkeys(m for line in _lines() for m in line.quant_methods))


@lru_cache(maxsize=256)
def resolve_version(version: str | None) -> tuple[str, VersionLine]:
    """Map ``0.33.0`` / ``0.33`` / ``v0.26.0`` / ``0.6.3.dev114+g4f95ffee`` to its line; None means the newest
    supported release. Returns the full version string and the line.

    Raises DomainError (field ``vllm_version``) for a version outside every supported line.
    """
    text = (version or DEFAULT_VERSION).strip()
    parsed = parse_version(text)
    files = _catalogue_files()  # (release, version, path), oldest first: only the chosen line is read
    if parsed is not None:
        candidates = [v for release, v, _ in files if release[:2] <= parsed[:2]]
        oldest_major_minor = files[0][0][:2]
        if candidates and parsed[:2] <= files[-1][0][:2] and parsed[:2] >= oldest_major_minor:
            full = canonical_version(text) or "{}.{}.{}".format(*parsed)
            if len(full) <= MAX_VERSION_CHARS:
                return full, _line(candidates[-1])
            raise DomainError(
                "vllm_version",
                f"vLLM version {full[:40]!r}…: at most {MAX_VERSION_CHARS} characters in its normal form",
                rule="version_unsupported",
            )
    first, last = files[0][0], files[-1][0]
    raise DomainError(
        "vllm_version",
        f"vLLM version {version!r} is not supported; supported: {first[0]}.{first[1]}.x … {last[0]}.{last[1]}.x "
        f"(catalogues generated from releases {', '.join(v for _, v, _ in files)})",
        rule="version_unsupported",
        accepted=[v for _, v, _ in files],
    )


# Backwards-compatible names
def __getattr__(name: str) -> tuple[str, ...] | dict[str, VersionLine]:
    if name == "ALL_QUANT_METHODS":
        return all_quant_methods()
    if name == "VERSION_LINES":
        return {l.line: l for l in _lines()}
    raise AttributeError(name)
