"""What a launch would make a node load, judged from facts read out of the vLLM release itself.

``scripts/vllm_loading.py`` (run by the catalogue generator for every supported line) follows each engine option,
each field of the config dataclasses behind JSON options (nested, list items as ``[]``) and each environment variable
vLLM reads to the calls that load: an import, an unpickle, a file read or write, a download location, another model,
tokenizer or adapter, or a secret. The facts are checked in beside the catalogue
(``service/data/vllm/loading/<release>.json``), each with the file and line of the call. This module matches a launch's
values against them: every key at any depth, through dicts and lists alike.

Facts name paths; a value is judged by its shape where the release does the same: a path-valued fact fires for a
value that names a place (a key whose name says path, dir or file, or a value with a separator, ``..`` or ``~``:
``engine_id`` ``"abc"`` becomes part of a file name, ``"../../etc"`` escapes it). The few values vLLM itself reads
as names rather than imports or paths are listed in ``NOT_LOADING`` with the line that decides it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

CODE = frozenset({"import", "unpickle"})
PATHS = frozenset({"read", "download_dir"})
PLACES = PATHS | {"write"}  # kinds whose value names a place
KINDS = CODE | PATHS | {"write", "other_weights", "secret", "safety_off"}
# a key under a JSON option that names code by its spelling: the analysis can lose a key where a dict is handed to
# a function that reads it with .get (KV offloading's spec_module_path), so the name alone also counts
CODE_SUFFIXES = ("_plugin", "_cls", "_class", "_module_path", "_processors", "_module")
# keys that name code whole: an offloading tier's module_path is imported for a tier type not built in
# (vllm 0.33.0 vllm/v1/kv_offload/tiering/factory.py:123-140, read from kv_connector_extra_config.secondary_tiers[])
CODE_KEYS = ("inductor_passes", "middleware", "module_path")
PATH_KEY = re.compile(r"(path|paths|dir|dirs|file|files|folder|root|home|cache)$")
HARMLESS: tuple[object, ...] = (None, "", "auto", [], {}, False)
MAX_NODES = 20_000  # JSON values a walk visits; the request bounds (jsoncheck) keep real launches far below


def _is_custom_proposer_path(value: object) -> bool:
    """vLLM's own test (vllm 0.33.0 vllm/config/speculative.py:1215-1224): parts that are Python identifiers (Unicode
    letters too, as ``str.isidentifier`` has them), no ``/`` and no URL scheme."""
    if not isinstance(value, str) or value.startswith(("http://", "https://", "file://")) or "/" in value:
        return False
    parts = value.split(".")
    return len(parts) >= 2 and all(part.isidentifier() for part in parts)


def _is_template_text(value: object) -> bool:
    """A chat template vLLM cannot open as a file: it opens the value first and reads it as the template only when
    that fails (vllm 0.33.0 vllm/renderers/chat_utils/chat_template.py:72-105), so Jinja characters alone do not make
    it text; a value that starts at the root or climbs with ``..`` names a file, whatever else it holds."""
    return (
        isinstance(value, str)
        and any(c in value for c in "{}\n")
        and not value.startswith(("/", "~"))
        and re.search(r"(^|/)\.\.(/|$)", value) is None
    )


# (path, kind) -> (what decides the value loads nothing, the vLLM 0.33.0 line that reads it so)
NOT_LOADING: dict[tuple[str, str], tuple[Callable[[object], bool], str]] = {
    # a repository id or path is a draft model; only a dotted name is imported as a custom proposer class
    ("speculative_config.model", "import"): (
        lambda v: not _is_custom_proposer_path(v),
        "vllm/config/speculative.py:1215 _is_custom_proposer_path",
    ),
    # torch's registered backends ("inductor", "eager", …) are names; a dotted value is resolved by qualified name
    ("compilation_config.backend", "import"): (
        lambda v: isinstance(v, str) and "." not in v,
        "vllm/config/compilation.py:1121",
    ),
    # the built-in executors are names; anything else is a class path
    ("distributed_executor_backend", "import"): (
        lambda v: v in ("mp", "ray", "uni", "external_launcher"),
        "vllm/config/parallel.py:38 DistributedExecutorBackend",
    ),
    # a chat template holding Jinja characters that cannot be opened as a file is the template itself
    ("chat_template", "read"): (_is_template_text, "vllm/renderers/chat_utils/chat_template.py:72-105"),
    # "auto" and "vllm" are the model's own generation config and vLLM's defaults; anything else is a repository
    ("generation_config", "other_weights"): (
        lambda v: v in ("auto", "vllm"),
        "vllm/config/model.py:1837",
    ),
    # a name in the API; only tensorizer's serialization downloads it, which a served launch never runs
    ("served_model_name", "other_weights"): (
        lambda v: True,
        "vllm/model_executor/model_loader/tensorizer.py:579 serialize_extra_artifacts",
    ),
    # the model is the manifest's own, judged everywhere else
    ("model", "other_weights"): (lambda v: True, "the manifest's model"),
    ("model", "read"): (lambda v: True, "the manifest's model"),
    # the two streams vLLM itself names (its default is ext://sys.stdout); any other ext:// value is imported
    ("env.VLLM_LOGGING_STREAM", "import"): (
        lambda v: v in ("ext://sys.stdout", "ext://sys.stderr"),
        "vllm/logger.py:68-70, vllm/envs.py:863",
    ),
}


@dataclass(frozen=True, slots=True)
class LoadingFacts:
    """One release's facts: path -> kinds and path -> the first call site, for options and env alike."""

    options: Mapping[str, frozenset[str]] = field(default_factory=dict)
    option_sites: Mapping[str, str] = field(default_factory=dict)
    reviewed: frozenset[str] = frozenset()  # paths read by hand: the whole value loads, containers too
    env: Mapping[str, frozenset[str]] = field(default_factory=dict)
    env_sites: Mapping[str, str] = field(default_factory=dict)
    env_names: frozenset[str] = frozenset()
    # the last key of every nested path that loads code, when specific enough to mean that anywhere
    # (``kv_connector_module_path``; not ``backend`` or ``model``, which other configs use for names)
    code_keys: frozenset[str] = frozenset()


def read_facts(raw: Mapping[str, Any] | None) -> LoadingFacts:
    """A release's generated loading facts (``service/data/vllm/loading/<release>.json``)."""
    if not raw:
        return LoadingFacts()

    def kinds(table: Mapping[str, list[dict[str, Any]]]) -> dict[str, frozenset[str]]:
        return {k: frozenset(f["kind"] for f in v if f.get("kind") in KINDS) for k, v in table.items()}

    def sites(table: Mapping[str, list[dict[str, Any]]]) -> dict[str, str]:
        return {k: v[0]["site"] for k, v in table.items() if v}

    table: dict[str, list[dict[str, Any]]] = {}
    for path, facts in (raw.get("options") or {}).items():  # every list level as one: facts reach one level
        table.setdefault(_generic_path(path), []).extend(facts)
    options = kinds(table)
    return LoadingFacts(
        options=options,
        option_sites=sites(table),
        reviewed=frozenset(k for k, v in table.items() if any(f.get("reviewed") for f in v)),
        env=kinds(raw.get("env") or {}),
        env_sites=sites(raw.get("env") or {}),
        env_names=frozenset(raw.get("env_names") or ()),
        code_keys=frozenset(
            key
            for p, k in options.items()
            if k & CODE and "." in p and "_" in (key := p.rsplit(".", 1)[-1]) and not key.endswith("]")
        ),
    )


@dataclass(frozen=True, slots=True)
class Load:
    """One thing a launch would make the node load: where it is set, what kind, the value, and why we know."""

    field: str  # engine_args.<path> or env.<NAME>
    kind: str
    value: str  # shown in messages (never for a secret)
    site: str


def _names_a_place(key: str, value: object) -> bool:
    if not isinstance(value, str) or not value.strip():
        return False
    return bool(PATH_KEY.search(key)) or any(s in value for s in ("/", "\\", "..")) or value.startswith("~")


def _fires(path: str, key: str, kind: str, value: object, reviewed: bool) -> bool:
    if value in HARMLESS:
        return False
    exempt = NOT_LOADING.get((path, kind))
    if exempt is not None and exempt[0](value):
        return False
    if kind == "secret" and isinstance(value, bool):
        return False  # --hf-token alone: the token the node logged in with (vllm/config/model.py:344-347)
    if isinstance(value, (dict, list)):
        return reviewed  # a container's own facts are its keys', except where the whole value was read by hand
    if kind in PLACES:
        return _names_a_place(key, value)
    return True


def _shown(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return repr(text if len(text) <= 120 else text[:117] + "…")


def _walk(name: str, value: Any) -> Iterator[tuple[tuple[str, ...], str, str, Any]]:
    """(fact paths, shown path, last key, value) for the option and every nested value: list items as ``[]`` in the
    fact path and ``[i]`` in the shown one; a dict's values also as ``[]`` (the release iterating ``.items()``, as
    it does over ``inductor_passes``). An explicit stack, bounded by MAX_NODES: past it the walk reports the rest as
    one opaque value, which the policy refuses."""
    stack: list[tuple[tuple[str, ...], str, str, Any]] = [((name,), name, name, value)]
    seen = 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            yield (name,), name, "…", {"truncated": True}
            return
        yield item
        paths, shown, key, node = item
        if isinstance(node, dict):
            stack.extend(((f"{paths[0]}.{k}", f"{paths[0]}[]"), f"{shown}.{k}", str(k), v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend(((f"{paths[0]}[]",), f"{shown}[{i}]", key, v) for i, v in enumerate(node))


def _json_text(value: Any) -> Any:
    """A string option's value that holds a JSON object or list (before 0.9 --compilation-config and
    --kv-transfer-config are strings vLLM parses itself), else the value unchanged."""
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return value
    return value


def _generic_path(path: str) -> str:
    """``a.b[].c[][]`` with every list level collapsed to one (``[]``), for facts found one level deep."""
    return re.sub(r"(\[\])+", "[]", path) if "[][]" in path else path


def option_loads(values: Mapping[str, Any], facts: LoadingFacts) -> list[Load]:
    """Every load the engine arguments (by dest) would cause, at any depth, in a stable order."""
    out: list[Load] = []
    for name, raw in values.items():
        value = _json_text(raw)
        if not isinstance(value, (dict, list)) and name not in facts.options:
            continue  # a plain value of an option the release loads nothing through (most of them)
        for paths, shown, key, node in _walk(name, value):
            _judge_value(tuple(map(_generic_path, paths)), f"engine_args.{shown}", key, node, facts, out)
            if key == "…":
                out.append(Load(f"engine_args.{name}", "import", "too large to judge", "bounded walk"))
    return sorted(out, key=lambda x: (x.field, x.kind))


def _judge_value(
    paths: tuple[str, ...], field: str, key: str, value: Any, facts: LoadingFacts, out: list[Load]
) -> None:
    """The loads of one value, found by any of its fact paths (named, or as an item)."""
    kinds = frozenset().union(*(facts.options.get(p, frozenset()) for p in paths))
    if "other_weights" in kinds:  # a model reference (repository id or path): named as other weights
        kinds = kinds - PATHS
    site = next((facts.option_sites[p] for p in paths if p in facts.option_sites), "")
    reviewed = any(p in facts.reviewed for p in paths)
    for kind in sorted(kinds):
        if _fires(paths[0], key, kind, value, reviewed):
            out.append(Load(field, kind, _shown(value), site))
    if "." in paths[0] and not kinds & CODE and _code_by_name(key, value, facts):
        out.append(Load(field, "import", _shown(value), f"by its name ({key})"))


def _code_by_name(key: str, value: object, facts: LoadingFacts) -> bool:
    """A nested key that names code the way the release's own loading keys do, wherever it sits (a MultiConnector
    inside a MultiConnector is the same key one level deeper than the facts reach)."""
    if value in HARMLESS or isinstance(value, (dict, list, bool, int, float)):
        return False
    if key == "policy" and isinstance(value, str) and "." in value:
        return True  # a KVCR tier's policy not built in is resolved by qualified name (kvcr/manager.py:101-112)
    return key in facts.code_keys or key.endswith(CODE_SUFFIXES) or key in CODE_KEYS


def env_loads(env: Mapping[str, Any], facts: LoadingFacts) -> list[Load]:
    """Every load the variables would cause, from the release's env facts (path kinds only for path-like values)."""
    out = []
    for name in sorted(k for k in env if isinstance(k, str)):
        value = env[name]
        for kind in sorted(facts.env.get(name, ())):
            place = kind in PLACES
            if kind == "secret" or (place and not _names_a_place(name.lower(), value)):
                continue
            if not place and str(value).strip().lower() in ("", "0", "false", "no", "off"):
                continue  # a switch left off, or a class variable left empty, loads nothing
            exempt = NOT_LOADING.get((f"env.{name}", kind))
            if exempt is not None and exempt[0](value):
                continue
            out.append(Load(f"env.{name}", kind, _shown(value), facts.env_sites.get(name, "")))
    return out


@dataclass(frozen=True, slots=True)
class Verdict:
    field: str
    rule: str
    severity: str  # "error" | "warning"
    message: str


# kind -> (rule, what the value does, where it applies: "always", "production", or "code" for the manifest's gate)
POLICY: dict[str, tuple[str, str, str]] = {
    "import": ("code_not_allowed", "imports code on the node", "code"),
    "unpickle": ("code_not_allowed", "unpickles data on the node, which runs code", "code"),
    "safety_off": ("safety_off", "turns a safety check off", "always"),
    "write": ("write_not_allowed", "writes files on the node", "always"),
    "read": ("path_not_allowed", "reads a file at a path of the plan's choosing", "production"),
    "download_dir": ("path_not_allowed", "downloads to a path of the plan's choosing", "production"),
    "secret": (
        "secret_in_engine_args",
        "is a secret: the argv is signed, shown to auditors and kept in the audit; "
        "set it in the plan's env instead (VLLM_API_KEY, HF_TOKEN), whose values are redacted",
        "always",
    ),
    "other_weights": ("other_weights", "loads other weights than the manifest's (not judged)", "warning"),
}


# Preflight's own refusals (vLLM would run these launches): what may be loaded, and options it cannot judge
POLICY_RULES = frozenset({rule for rule, _, _ in POLICY.values()} | {"trust_remote_code_not_allowed", "flag_unjudged"})


def judge(loads: list[Load], *, environment: str, allow_remote_code: bool | None) -> list[Verdict]:
    """The policy over the loads (``POLICY``): code needs the manifest's ``allow_remote_code`` in production
    (``None``: not judged here, the caller has no manifest); switches that turn a safety check off and write paths
    are refused; paths to read or download into are refused in production (the node decides where weights and files
    come from); a secret is refused as an engine argument; other weights are named in a warning. One verdict per
    field and rule (a value may reach an import and an unpickle alike)."""
    out: dict[tuple[str, str], Verdict] = {}
    for load in loads:
        rule, does, when = POLICY[load.kind]
        if load.kind == "secret" and not load.field.startswith("engine_args."):
            continue  # the env is the place for a secret
        if when == "code" and not (allow_remote_code is False and environment == "production"):
            continue
        if when == "production" and environment != "production":
            continue
        if load.field == "engine_args.trust_remote_code":
            rule = "trust_remote_code_not_allowed"
        shown = load.field if load.kind == "secret" else f"{load.field} {load.value}"
        site = f" ({load.site})" if load.site else ""
        severity = "warning" if when == "warning" else "error"
        out.setdefault((load.field, rule), Verdict(load.field, rule, severity, f"{shown} {does}{site}"))
    return list(out.values())


REDACTED = "<redacted>"


def option_of(field: str) -> str:
    """The option dest of an ``engine_args.<dest>…`` field (``engine_args.a.b[0].c`` -> ``a``)."""
    return field.removeprefix("engine_args.").split(".", 1)[0].split("[", 1)[0]


def redact_argv(argv: list[str], flags: set[str]) -> list[str]:
    """``argv`` with the values of ``flags`` (``--api-key k1 k2``, ``--api-key=k``) replaced by ``<redacted>``."""
    out: list[str] = []
    hiding = False
    for token in argv:
        if token.startswith("-"):
            hiding = token in flags
            name, eq, _ = token.partition("=")
            out.append(f"{name}={REDACTED}" if eq and name in flags else token)
        else:
            out.append(REDACTED if hiding else token)
    return out
