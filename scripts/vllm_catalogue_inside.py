"""Runs INSIDE a throw-away virtual environment that has one vLLM release installed (``pip install --no-deps``):
builds the parser that ``vllm serve`` builds and writes what Preflight needs to know about that release as JSON on
stdout. Started by scripts/gen_vllm_catalogue.py; never imported by the service.

Modules the parser does not need at build time (CUDA kernels, torch, tokenizers, …) are replaced by mocks the way
vLLM's own documentation build does (docs/mkdocs/hooks/generate_argparse.py: ``auto_mock``), so no GPU and no
torch are needed. The model registry, quantization names and KV-cache dtypes are read from the release's source
files with ``ast`` (the same files vLLM reads at run time), never typed by hand.
"""

from __future__ import annotations

import argparse
import ast
import enum
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import logging
import os
import pathlib
import sys
import typing
from contextlib import nullcontext
from unittest.mock import MagicMock, patch

from vllm_argparse import argparse_facts  # beside this script (python puts the script's directory first on the path)

logging.disable(logging.CRITICAL)

try:
    from pydantic_core import core_schema
except ImportError:  # pragma: no cover - pydantic is installed next to vLLM
    core_schema = None


class PydanticMagicMock(MagicMock):
    """A mock module that pydantic can build a schema for (as vLLM's docs build)."""

    def __init__(self, *args, **kwargs):
        name = kwargs.pop("name", None)
        super().__init__(*args, **kwargs)
        self.__spec__ = importlib.machinery.ModuleSpec(name, None)
        self.__path__ = []

    def __get_pydantic_core_schema__(self, source_type, handler):
        return core_schema.any_schema()


class MockCustomOp:
    @staticmethod
    def register(name):
        return lambda cls: cls

    @staticmethod
    def register_oot(*a, **k):
        return lambda cls: cls


MOCKED: list[str] = []  # never a vLLM module: every one is imported for real or the generation fails


def mock(name: str, module=None) -> None:
    sys.modules[name] = module if module is not None else PydanticMagicMock(name=name)
    MOCKED.append(name)


def auto_import(module_name: str, attr: str | None = None, tries: int = 400):
    if importlib.util.find_spec("torch") is None and "torch" not in sys.modules:
        mock("torch")
        mock("vllm._C")
        mock("vllm.model_executor.custom_op", MagicMock(CustomOp=MockCustomOp))
        mock("torch.nn", MagicMock(Parameter=object, Module=object))
    last = None
    for _ in range(tries):
        try:
            # the package first: after a failed attempt ``vllm`` is gone from sys.modules while the submodules that
            # finished stay; importing one of those first re-enters the package from inside it (0.8.5: cli_args ->
            # engine.arg_utils -> ``import vllm.envs`` -> vllm/__init__.py -> the half-built engine.arg_utils)
            importlib.import_module(module_name.split(".")[0])
            module = importlib.import_module(module_name)
            return getattr(module, attr) if attr else module
        except ModuleNotFoundError as e:
            if not e.name or e.name in sys.modules and e.name == last or e.name.split(".")[0] == "vllm":
                raise  # never mock vLLM's own modules: the module asked for is not in this release
            last = e.name
            mock(e.name)
        except ImportError as e:  # "cannot import name X from mocked module"
            name = getattr(e, "name", None)
            if name and name not in sys.modules and name.split(".")[0] != "vllm":
                mock(name)
                continue
            raise
    raise ImportError(f"could not import {module_name}")


def jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        if isinstance(value, float) and value != value:
            return None
        return value
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, MagicMock):
        return None
    return repr(value)


def closure(fn) -> dict:
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    if code is None:
        return {}
    return {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells)}


def value_kind(t) -> tuple[str, bool]:
    """What a ``type=`` callable of vLLM's parser accepts, told from the callable itself (vllm/engine/arg_utils.py
    parse_type / optional_type / union_dict_and_str / parse_dataclass, utils/argparse_utils.py human_readable_int):
    returns (kind, optional) where optional means '' and 'None' parse to None."""
    optional = False
    for _ in range(6):
        name = getattr(t, "__name__", "")
        if name == "_optional_type":
            optional = True
            t = closure(t).get("return_type", str)
            continue
        if name == "_parse_type":
            t = closure(t).get("return_type", str)
            continue
        break
    name = getattr(t, "__name__", "") if t is not None else "str"
    if t is None or t is str:
        return "str", optional
    if t is int:
        return "int", optional
    if t is float:
        return "float", optional
    if t is json.loads or name == "loads":
        return "json", optional
    if name == "parse_dataclass":
        return "json", optional
    if name == "union_dict_and_str":
        return "json_or_str", True
    if name == "human_readable_int":
        return "size", optional
    if name == "human_readable_int_or_auto":
        return "size_or_auto", optional
    if name in ("check_port",):
        return "int", optional
    return "str", optional  # other callables take a string (parse_reasoning_parser, ...)


def dataclass_of(t):
    """The config dataclass a ``parse_dataclass`` type callable validates against (its ``cls`` default)."""
    for _ in range(6):
        name = getattr(t, "__name__", "")
        if name in ("_optional_type", "_parse_type"):
            t = closure(t).get("return_type")
            continue
        break
    if getattr(t, "__name__", "") == "parse_dataclass" and getattr(t, "__defaults__", None):
        return t.__defaults__[0]
    return None


def key_schema(cls, depth: int = 0, validated: bool = False):
    """The keys a JSON value may hold for a config dataclass that forbids extra keys: ``{field: sub-schema or None}``
    (a nested config dataclass gets its own schema); None where extra keys are allowed or the class is unreadable.
    With ``class`` and ``values`` (value facts) where pydantic validates the value: ``validated`` (parse_dataclass
    runs TypeAdapter(cls), which validates any dataclass, and a parent's validation covers its nested classes) or a
    pydantic dataclass (``Cls(**cfg)``); a plain dataclass built by ``Cls(**cfg)`` validates nothing."""
    import dataclasses
    import typing

    if depth > 4 or not dataclasses.is_dataclass(cls):
        return None
    config = getattr(cls, "__pydantic_config__", None) or {}
    if config.get("extra") != "forbid":
        return None
    try:
        hints = typing.get_type_hints(cls)
    except Exception:
        hints = {}
    out = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        sub = None
        hint = hints.get(f.name)
        for arg in (hint, *typing.get_args(hint)):
            if isinstance(arg, type) and dataclasses.is_dataclass(arg):
                sub = key_schema(arg, depth + 1, validated or is_pydantic_dataclass(cls))
                break
        out[f.name] = sub
    values = class_values(cls) if validated or is_pydantic_dataclass(cls) else None
    if values is None:
        return {"keys": out}
    return {"keys": out, "class": cls.__name__, "values": {k: v for k, v in values.items() if k in out}}


# ------------------------------------------------------------------------------------------------ value facts
# What pydantic's validation of a config class enforces on each field's value, read from the class's own core
# schema (the validator vLLM runs: TypeAdapter(cls).validate_json in parse_dataclass, or cls(**dict)). Facts are
# only recorded where the schema says exactly what passes; anything that can rewrite or widen the input (a before,
# wrap or plain validator, an Enum with _missing_, a mocked type, a field alias) is left unjudged.

SCHEMA_TYPES = {
    "int": "int",
    "float": "float",
    "bool": "bool",
    "str": "str",
    "dict": "dict",
    "list": "list",
    "tuple": "list",
    "set": "list",
    "frozenset": "list",
}
BOUNDS = ("ge", "gt", "le", "lt")


def _collect_refs(schema, defs: dict, depth: int = 0) -> None:
    """Every sub-schema that carries a ``ref`` (definitions and inline), so a ``definition-ref`` resolves."""
    if depth > 40:
        return
    if isinstance(schema, dict):
        if isinstance(schema.get("ref"), str):
            defs.setdefault(schema["ref"], schema)
        for v in schema.values():
            if isinstance(v, (dict, list)):
                _collect_refs(v, defs, depth + 1)
    elif isinstance(schema, list):
        for v in schema:
            _collect_refs(v, defs, depth + 1)


def _choices(values) -> dict | None:
    """A Literal's or an Enum's values, where all are JSON scalars (None: accepted as null)."""
    out, null = [], False
    for v in values:
        v = v.value if isinstance(v, enum.Enum) else v
        if v is None:
            null = True
        elif isinstance(v, (bool, int, float, str)) and not isinstance(v, enum.Enum):
            out.append(v)
        else:
            return None
    if not out:
        return None
    return {"choices": out, **({"null": True} if null else {})}


def _union(schema: dict, defs: dict, depth: int) -> dict | None:
    members, null = [], False
    for choice in schema.get("choices") or []:
        sub = choice[0] if isinstance(choice, (tuple, list)) else choice
        if isinstance(sub, dict) and sub.get("type") == "none":
            null = True
            continue
        facts = value_facts(sub, defs, depth + 1)
        if facts is None:
            return None
        null = facts.pop("null", False) or null
        members.append(facts)
    if not members:
        return None
    if all(set(m) == {"choices"} for m in members):
        members = [{"choices": [c for m in members for c in m["choices"]]}]
    out = members[0] if len(members) == 1 else {"any_of": members}
    return {**out, "null": True} if null else out


def _scalar(t: str, schema: dict, defs: dict, depth: int) -> dict:
    out: dict = {"type": SCHEMA_TYPES[t]}
    if t in ("int", "float"):
        for b in BOUNDS:
            v = schema.get(b)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[b] = v
    if t == "list" and isinstance(schema.get("items_schema"), dict):
        items = value_facts(schema["items_schema"], defs, depth + 1)
        if items:
            out["items"] = items
    if t == "dict" and isinstance(schema.get("values_schema"), dict):  # dict[str, list[float]]: each value's facts
        values = value_facts(schema["values_schema"], defs, depth + 1)
        if values:
            out["values"] = values
    return out


def value_facts(schema, defs: dict, depth: int = 0) -> dict | None:
    """What pydantic's validation enforces on one value, from its core schema: ``type`` (int, float, bool, str,
    dict, list, or object: a nested config class, judged by its own key schema), ``choices`` (Literal and Enum
    values; with ``type`` int/float/str for an int/float/str Enum, whose input pydantic first reads as that type),
    ``null`` (None passes), bounds ``ge``/``gt``/``le``/``lt``, ``items`` (a list's elements), ``values`` (a
    dict's values; its keys are not judged), ``any_of`` (a union). None: not judged (the schema can accept more
    than these facts say)."""
    if depth > 12 or not isinstance(schema, dict):
        return None
    t = schema.get("type")
    if t == "definition-ref":
        return value_facts(defs.get(schema.get("schema_ref")), defs, depth + 1)
    if t in ("definitions", "default", "function-after"):
        return value_facts(schema.get("schema"), defs, depth + 1)
    if t == "nullable":
        inner = value_facts(schema.get("schema"), defs, depth + 1)
        return None if inner is None else {**inner, "null": True}
    if t == "lax-or-strict":
        return value_facts(schema.get("lax_schema"), defs, depth + 1)
    if t == "json-or-python":
        as_json = value_facts(schema.get("json_schema"), defs, depth + 1)
        return as_json if as_json == value_facts(schema.get("python_schema"), defs, depth + 1) else None
    if t == "literal":
        return _choices(schema.get("expected") or [])
    if t == "enum":
        if schema.get("missing") is not None:  # Enum._missing_ may map other inputs to members
            return None
        facts = _choices(schema.get("members") or [])
        if facts and schema.get("sub_type") in ("int", "float", "str"):
            facts["type"] = schema["sub_type"]
        return facts
    if t == "union":
        return _union(schema, defs, depth)
    if t == "dataclass":
        return {"type": "object"}
    if t in SCHEMA_TYPES:
        return _scalar(t, schema, defs, depth)
    return None  # any, is-instance, callable, model, function-before/wrap/plain, tagged-union, ...


def is_pydantic_dataclass(cls) -> bool:
    try:
        from pydantic.dataclasses import is_pydantic_dataclass as check
    except ImportError:  # pragma: no cover - pydantic 1 (no release Preflight ships)
        return False
    return bool(check(cls))


def class_values(cls) -> dict | None:
    """Per init field of a config dataclass as TypeAdapter(cls) validates it: its value facts and ``required`` (no
    default). None when the class's validation is not readable (a schema pydantic cannot build, e.g. with mocked
    types) or a validator of the class itself may rewrite the input first."""
    try:
        from pydantic import TypeAdapter

        return _class_values(dict(TypeAdapter(cls).core_schema), cls)
    except Exception:
        return None


def _class_values(schema: dict, cls=None) -> dict | None:
    defs: dict = {}
    _collect_refs(schema, defs)
    for _ in range(12):  # down to the dataclass, through definitions and after-validators only
        t = schema.get("type")
        if t == "definition-ref":
            schema = defs.get(schema.get("schema_ref")) or {}
        elif t in ("definitions", "function-after"):
            schema = schema.get("schema") or {}
        else:
            break
    args = schema.get("schema") if schema.get("type") == "dataclass" else None
    if not isinstance(args, dict) or args.get("type") != "dataclass-args":
        return None
    out = {}
    for f in args.get("fields") or []:
        # an InitVar (``init_only``) is validated like a field (ModelConfig.media_io_kwargs) and then handed on
        if f.get("init") is False or f.get("validation_alias") is not None:
            continue
        facts = value_facts(f.get("schema"), defs) or (validated_facts(cls, f["name"], f.get("schema")) or {})
        if (f.get("schema") or {}).get("type") != "default":
            facts["required"] = True
        if facts:
            out[f["name"]] = facts
    return out


# ------------------------------------------------------------------------------------------------ probed validators
# A field behind a ``before`` or ``wrap`` validator (a function vLLM wrote: ``value.lower().replace("-", "_")``,
# ``Enum[value.upper()]``, "None skips validation") is judged only where probing the class itself shows what the
# function does: the whole class validated as vLLM validates it (``TypeAdapter(cls).validate_json``) on probe
# values, beside the field's bare annotation. Two shapes are recorded, each only when every probe agrees with it:
#  - the field behaves as its annotation, except that None may pass where the annotation refuses it: the
#    annotation's facts (``null`` where None passes);
#  - a Literal/Enum field: a string passes exactly when its ``fold`` (``lower_underscore``, ``lower`` or ``same``)
#    is one of ``folded`` (the folded probes that pass); any other value as the annotation says (``other``) where
#    the probes agree with it, else it is not judged.
# Probes: the annotation's Literal values and Enum names and values in several spellings, every string literal of
# the validators' source and of the dicts, sets, sequences and Enums they name, and values no spelling reaches. A
# validator that calls a function or module of its own module (which may map aliases no probe reaches) is not
# judged.

FOLDS = {
    "lower_underscore": lambda s: s.lower().replace("-", "_"),
    "upper": lambda s: s.upper(),
    "lower": lambda s: s.lower(),
    "same": lambda s: s,
}
# letters whose upper and lower case are not inverse: probes that tell a validator's upper() from its lower()
NOT_INVERSE = {"i": "\u0131", "k": "\u212a", "s": "\u017f"}
NON_STRINGS = (None, True, False, 0, 1, -1, 4, 2.5, [], {}, ["a"], {"a": 1})
BASE_STRINGS = ("", "true", "false", "yes", "1", "0", "1.5", "none", "None", "auto", "zz-probe", "ZZ_PROBE", "a,b")


def _functions(schema, depth: int = 0) -> list:
    """Every validator function in a field's schema."""
    out: list = []
    if depth > 20:
        return out
    if isinstance(schema, dict):
        fn = schema.get("function")
        if isinstance(fn, dict) and fn.get("function") is not None:
            out.append(fn["function"])
        for v in schema.values():
            if isinstance(v, (dict, list)):
                out += _functions(v, depth + 1)
    elif isinstance(schema, list):
        for v in schema:
            out += _functions(v, depth + 1)
    return out


def _literals(obj) -> set[str]:
    if isinstance(obj, type) and issubclass(obj, enum.Enum):
        return {m.name for m in obj} | {m.value for m in obj if isinstance(m.value, str)}
    if isinstance(obj, dict):
        return {k for k in obj if isinstance(k, str)}
    if isinstance(obj, (set, frozenset, list, tuple)):
        return {x for x in obj if isinstance(x, str)}
    return set()


def _validator_strings(fn) -> set[str] | None:
    """The strings a validator function can compare with: its literals and those of the data it names; None when it
    calls a function or module of its own module (an alias table no probe reaches)."""
    import inspect
    import textwrap
    import types

    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    out = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    names = getattr(fn, "__globals__", {})
    for name in code.co_names:
        if name not in names:  # an attribute or a builtin
            continue
        obj = names[name]
        if isinstance(obj, types.ModuleType) or (callable(obj) and not isinstance(obj, type)):
            return None
        out |= _literals(obj)
    return out


def _annotation_strings(schema, depth: int = 0) -> set[str]:
    """The Literal values and Enum member names and values an annotation's schema lists."""
    out: set[str] = set()
    if depth > 20:
        return out
    if isinstance(schema, dict):
        if schema.get("type") == "literal":
            out |= {v for v in schema.get("expected") or [] if isinstance(v, str)}
        if schema.get("type") == "enum":
            members = schema.get("members") or []
            out |= {m.name for m in members} | {m.value for m in members if isinstance(m.value, str)}
        for v in schema.values():
            if isinstance(v, (dict, list)):
                out |= _annotation_strings(v, depth + 1)
    elif isinstance(schema, list):
        for v in schema:
            out |= _annotation_strings(v, depth + 1)
    return out


def _spellings(words: set[str]) -> list[str]:
    out = set(BASE_STRINGS)
    for w in words:
        for v in (w, w.upper(), w.lower(), w.title(), w + "x"):
            out |= {v, v.replace("_", "-"), v.replace("-", "_")}
        for plain, odd in NOT_INVERSE.items():
            low = w.lower()
            if plain in low:
                out.add(low.replace(plain, odd, 1))
    return sorted(out)


def _choice_schema(schema, depth: int = 0) -> bool:
    """The annotation is a Literal or an Enum (or one of those or None)."""
    if not isinstance(schema, dict) or depth > 12:
        return False
    t = schema.get("type")
    if t in ("literal", "enum"):
        return True
    if t in ("nullable", "default", "definitions"):
        return _choice_schema(schema.get("schema"), depth + 1)
    if t == "union":
        subs = [c[0] if isinstance(c, (tuple, list)) else c for c in schema.get("choices") or []]
        real = [c for c in subs if not (isinstance(c, dict) and c.get("type") == "none")]
        return bool(real) and all(_choice_schema(c, depth + 1) for c in real)
    return False


class _Slow(Exception):
    pass


def _alarm(signum, frame):
    raise _Slow


_ADAPTERS: dict = {}


def _probe_adapter(cls):
    """TypeAdapter(cls) where the class builds from its defaults alone, quickly and without the network (ModelConfig
    fetches its default model): else None, and the class's validated fields stay unjudged."""
    import signal

    if cls not in _ADAPTERS:
        _ADAPTERS[cls] = None
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, 2.0)
        try:
            from pydantic import TypeAdapter

            adapter = TypeAdapter(cls)
            adapter.validate_json("{}")
            _ADAPTERS[cls] = adapter
        except Exception:  # _Slow, a ValidationError, what a __post_init__ raises
            pass
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    return _ADAPTERS[cls]


def validated_facts(cls, name: str, schema) -> dict | None:
    """The value facts of a field behind a before/wrap validator, as probing shows them (None: not judged; also when
    probing takes more than 10 s)."""
    import signal

    if cls is None or not _functions(schema) or _probe_adapter(cls) is None:
        return None
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, 10.0)
    try:
        return _validated_facts(cls, name, schema)
    except _Slow:
        return None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _top_level(facts: dict | None) -> dict | None:
    """What the probes can confirm of the annotation's facts: the value's own type, choices and bounds. The probes
    do not reach inside a list or a dict (a validator may rewrite its items: AttentionConfig.backend_per_kind maps
    names to Enum members), so facts about items and values are dropped, and a union is not judged."""
    if facts is None or "any_of" in facts:
        return None
    return {k: v for k, v in facts.items() if k not in ("items", "values")}


def _validated_facts(cls, name: str, schema) -> dict | None:
    whole = _probe_adapter(cls)
    try:
        from pydantic import TypeAdapter

        bare = TypeAdapter(typing.get_type_hints(cls)[name])
        bare_schema = dict(bare.core_schema)
    except Exception:
        return None
    words = _annotation_strings(bare_schema)
    for fn in _functions(schema):
        found = _validator_strings(fn)
        if found is None:
            return None
        words |= found

    def passes(adapter, text: str) -> bool:
        try:
            adapter.validate_json(text)
            return True
        except _Slow:
            raise
        except Exception:  # a ValidationError, or what a validator raises (Enum[name]: KeyError)
            return False

    def field_ok(v) -> bool:
        return passes(whole, json.dumps({name: v}))

    def bare_ok(v) -> bool:
        return passes(bare, json.dumps(v))

    strings = _spellings(words)
    bare_defs: dict = {}
    _collect_refs(bare_schema, bare_defs)
    inner = _top_level(value_facts(bare_schema, bare_defs))
    null = field_ok(None)
    agree = [field_ok(v) == bare_ok(v) for v in NON_STRINGS if v is not None]
    if inner is not None and all(agree) and all(field_ok(s) == bare_ok(s) for s in strings):
        return {**inner, "null": True} if null and not inner.get("null") else inner
    if not _choice_schema(bare_schema):
        return None
    for fold, f in FOLDS.items():
        folded = {f(s) for s in strings if field_ok(s)}
        if folded and all(field_ok(s) == (f(s) in folded) for s in strings):
            out: dict = {"fold": fold, "folded": sorted(folded)}
            if inner is not None and all(agree):
                out["other"] = {k: v for k, v in inner.items() if k != "null"}
            return {**out, "null": True} if null else out
    return None


class EngineArgsSource:
    """How EngineArgs (vllm/engine/arg_utils.py) turns parsed option values into config classes, read from its
    source with ``ast``: which JSON options it expands into a class (``return WatermarkConfig(**cfg)`` where
    ``cfg = self.watermark_config``, json.loads'ed if a string) and which options it hands unchanged to a class
    field (``VllmConfig(..., optimization_level=self.optimization_level)``). An attribute EngineArgs assigns
    anywhere (``self.x = ...``) is left out: its value may be rewritten before the class sees it."""

    def __init__(self):
        import inspect
        import textwrap

        try:
            engine_args = auto_import("vllm.engine.arg_utils", "EngineArgs")
            self.tree = ast.parse(textwrap.dedent(inspect.getsource(engine_args)))
            self.names = vars(sys.modules[engine_args.__module__])
        except Exception:  # pragma: no cover - an unreadable release: keys only, as before
            self.tree, self.names = ast.Module(body=[], type_ignores=[]), {}
        self.assigned = {
            t.attr
            for node in ast.walk(self.tree)
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
        }

    def config_class(self, name: str):
        import dataclasses

        cls = self.names.get(name)
        return cls if isinstance(cls, type) and dataclasses.is_dataclass(cls) else None

    def expanded(self) -> dict:
        """dest -> the config class EngineArgs builds from the option's dict by ``Cls(**cfg)``."""
        out = {}
        for fn in ast.walk(self.tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for ret in ast.walk(fn):
                call = ret.value if isinstance(ret, ast.Return) else None
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and not call.args):
                    continue
                if len(call.keywords) != 1 or call.keywords[0].arg is not None:
                    continue
                star = call.keywords[0].value
                dest = _copied_from_self(fn, star.id, star) if isinstance(star, ast.Name) else None
                cls = self.config_class(call.func.id)
                if dest and cls is not None and dest not in self.assigned:
                    out.setdefault(dest, cls)
        return out

    def passed(self) -> dict:
        """dest -> (config class, field) for ``Cls(field=self.dest)`` where create_engine_config surely builds the
        class (``surely_run``: no condition, loop or try around the call, no return before it, in a method
        create_engine_config itself surely calls) and the dest goes to one field only. A dest EngineArgs writes or
        mutates anywhere (``self.x = ...``, ``(self.a, self.x) = ...``, ``self.x[k] = ...``, ``self.x.update()``)
        is left out: the class may see another value than the one given."""
        methods = {fn.name: fn for fn in ast.walk(self.tree) if isinstance(fn, ast.FunctionDef)}
        reached, todo, calls = set(), ["create_engine_config"], []
        while todo:
            name = todo.pop()
            if name in reached or name not in methods:
                continue
            reached.add(name)
            for node in surely_run(methods[name]):
                f = node.func if isinstance(node, ast.Call) else None
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
                    todo.append(f.attr)
                elif isinstance(f, ast.Name):
                    calls.append(node)
        changed = written_attributes(self.tree)
        seen: dict = {}
        for call in calls:
            cls = self.config_class(call.func.id)
            for kw in call.keywords if cls is not None else []:
                v = kw.value
                if kw.arg and isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "self":
                    seen.setdefault(v.attr, set()).add((cls, kw.arg))
        return {d: next(iter(t)) for d, t in seen.items() if len(t) == 1 and d not in changed}


MUTATORS = {"update", "setdefault", "pop", "popitem", "clear", "append", "extend", "insert", "remove", "add"}


def written_attributes(tree: ast.AST) -> set[str]:
    """Every ``self.<name>`` the code stores, deletes, assigns an item of or calls a mutating method on."""
    out = set()
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            target = node
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
            target = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            target = node.func.value
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            out.add(target.attr)
    return out


def surely_run(fn: ast.FunctionDef) -> list[ast.AST]:
    """The nodes of a function that run whenever it runs: statements up to the first one that may return (a
    statement holding a ``return`` ends the list after it), never inside if/for/while/try/match/with bodies, the
    branches of ``a if c else b``, ``a and b``, comprehensions, lambdas or nested functions."""
    out: list[ast.AST] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return
        if isinstance(node, (ast.If, ast.While)):
            visit(node.test)
            return
        if isinstance(node, ast.For):
            visit(node.iter)
            return
        if isinstance(node, (ast.Try, ast.With, ast.AsyncWith, ast.Match)) or type(node).__name__ == "TryStar":
            return  # a with-block's manager may swallow the error (contextlib.suppress)
        if isinstance(node, ast.IfExp):
            visit(node.test)
            return
        if isinstance(node, ast.BoolOp):
            visit(node.values[0])
            return
        out.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    for stmt in fn.body:
        visit(stmt)
        if any(isinstance(n, ast.Return) for n in ast.walk(stmt)):
            break
    return out


def _copied_from_self(fn: ast.FunctionDef, var: str, star: ast.Name) -> str | None:
    """The one ``self.<dest>`` a local ``var`` holds, when ``var`` is only assigned ``self.<dest>`` or
    ``json.loads(var)``, tested (``isinstance(var, str)``, ``var is None``) and expanded by ``star``; None when
    anything else touches it (an update, an item assignment, a merge)."""
    allowed, sources = {id(star)}, set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            tgt, val = node.targets[0], node.value
            if isinstance(tgt, ast.Name) and tgt.id == var:
                allowed.add(id(tgt))
                if isinstance(val, ast.Attribute) and isinstance(val.value, ast.Name) and val.value.id == "self":
                    sources.add(val.attr)
                elif not (
                    isinstance(val, ast.Call)
                    and ast.unparse(val.func) == "json.loads"
                    and len(val.args) == 1
                    and isinstance(val.args[0], ast.Name)
                ):
                    return None
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("isinstance", "json.loads") and node.args:
            allowed.add(id(node.args[0]))
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and len(node.ops) == 1:
            if isinstance(node.ops[0], (ast.Is, ast.IsNot)):
                allowed.add(id(node.left))
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id == var and id(node) not in allowed:
            return None
    return next(iter(sources)) if len(sources) == 1 else None


PARSED_AS = {"int": "int", "size": "int", "size_or_auto": "int", "float": "float", "str": "str"}
NOT_JUDGED = ("bool", "flag", "bool_value")  # the parser hands on True/False (or a constant) only


def option_values(action, kind: str, passed: dict) -> dict | None:
    """For an option EngineArgs hands unchanged to one field of a pydantic config class it surely builds
    (``EngineArgsSource.passed``), the field's value facts with the class, field and the field's source line,
    where they say more than the parser checks: choices the parser does not list, numeric bounds, a type other
    than the one the parser reads (a string handed to an Enum field), a union, a list's items or a dict's values
    (``--watermark``: SchedulerConfig.watermark ``Field(ge=0.0, lt=1.0)``; ``--media-io-kwargs``:
    ``dict[str, dict[str, Any]]``). The parser's own ``type`` (int, a human-readable size, JSON) runs first; the
    class then validates the parsed value."""
    if kind in NOT_JUDGED or action.dest not in passed:
        return None
    cls, field_name = passed[action.dest]
    if not is_pydantic_dataclass(cls):  # a plain dataclass does not validate what it is given
        return None
    facts = {k: v for k, v in ((class_values(cls) or {}).get(field_name) or {}).items() if k != "required"}
    if action.choices is not None:
        facts.pop("choices", None)  # the parser refuses the rest first (and says so in its own words)
    listed = action.nargs not in (None, "?") or type(action).__name__ == "_AppendAction"
    if not says_more(facts, "list" if listed else PARSED_AS.get(kind), PARSED_AS.get(kind) if listed else None):
        return None
    return {"class": cls.__name__, "field": field_name, **field_source(cls, field_name), **facts}


def expands_numbers(fn) -> bool:
    """The option's type function expands bare ``1k``/``2M`` tokens in its JSON before validating it
    (``parse_dataclass`` calling ``_expand_json_human_readable_numbers``, vllm 0.33.0 engine/arg_utils.py:302-321,
    371)."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return code is not None and "_expand_json_human_readable_numbers" in code.co_names


def says_more(facts: dict, parsed: str | None, item: str | None = None) -> bool:
    """Whether value facts can refuse a value the parser let through: ``parsed`` is the type the parser made of it
    (``list`` for a list option, whose elements are ``item``; None for JSON, which the parser does not check): a
    union with a member that takes any such value says nothing more, nor a type the parser already made."""
    if any(k in facts for k in ("choices", "ge", "gt", "le", "lt", "values", "fold")):
        return True
    if "any_of" in facts:
        return not any(m == {"type": parsed} for m in facts["any_of"])
    if "items" in facts and says_more(facts["items"], item):
        return True
    return facts.get("type") is not None and facts.get("type") != parsed


def field_source(cls, name: str) -> dict:
    """``{"source": "vllm/config/scheduler.py:123"}``: where the class (or the base that declares it) declares
    the field; empty when the source cannot be read."""
    import inspect
    import textwrap

    for klass in getattr(cls, "__mro__", ()):
        if name not in vars(klass).get("__annotations__", {}):
            continue
        try:
            path = inspect.getsourcefile(klass) or ""
            lines, first = inspect.getsourcelines(klass)
            tree = ast.parse(textwrap.dedent("".join(lines)))
        except (OSError, TypeError, SyntaxError):
            return {}
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name:
                rel = path[path.rfind("/vllm/") + 1 :] if "/vllm/" in path else pathlib.Path(path).name
                return {"source": f"{rel}:{first + node.lineno - 1}"}
        return {}
    return {}


def options(parser: argparse.ArgumentParser, source: EngineArgsSource | None = None) -> tuple[list[dict], list[dict]]:
    out, positionals = [], []
    expanded = source.expanded() if source is not None else {}
    passed = source.passed() if source is not None else {}
    every = {}  # action -> every accepted spelling (hidden ones included)
    for spelling, action in parser._option_string_actions.items():
        every.setdefault(id(action), []).append(spelling)
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings:
            positionals.append(
                {"dest": action.dest, "nargs": jsonable(action.nargs), "default": jsonable(action.default)}
            )
            continue
        spellings = every.get(id(action), list(action.option_strings))
        negative: list[str] = []
        if isinstance(action, argparse.BooleanOptionalAction):
            neg = getattr(action, "negative_option_strings", None)
            negative = sorted(s for s in spellings if (s in neg if neg is not None else s.startswith("--no-")))
            kind, optional = "bool", False
        elif type(action).__name__ == "StoreBoolean":  # <= 0.7: --x true|false (vllm/engine/arg_utils.py StoreBoolean)
            kind, optional = "bool_value", False
        elif (
            isinstance(
                action,
                (
                    argparse._StoreTrueAction,
                    argparse._StoreFalseAction,
                    argparse._StoreConstAction,
                    argparse._CountAction,
                ),
            )
            or action.nargs == 0
        ):
            kind, optional = "flag", False
        else:
            kind, optional = value_kind(action.type)
        choices = None
        if action.choices is not None:
            try:
                choices = [jsonable(c) for c in action.choices]
            except TypeError:
                choices = None
        help_text = action.help if isinstance(action.help, str) else ""
        parsed_into = dataclass_of(action.type) if kind == "json" else None  # validated by TypeAdapter at parse
        built = expanded.get(action.dest) if kind == "json" and parsed_into is None else None
        schema = key_schema(parsed_into, validated=True) if parsed_into is not None else None
        schema = key_schema(built) if built is not None else schema
        values = option_values(action, kind, passed) if schema is None else None  # json_keys judge those
        deprecated = bool(getattr(action, "deprecated", False)) or action in getattr(parser, "_deprecated", ())
        out.append(
            {
                "dest": action.dest,
                "option_strings": sorted(spellings, key=lambda x: (not x.startswith("--"), x in negative, x)),
                "negative_option_strings": negative,
                "action": type(action).__name__,
                "kind": kind,
                "optional": optional,
                "type": getattr(action.type, "__name__", None) if action.type is not None else None,
                "nargs": jsonable(action.nargs),
                "choices": choices,
                "default": jsonable(action.default) if action.default is not argparse.SUPPRESS else None,
                "const": jsonable(getattr(action, "const", None)),
                "deprecated": deprecated,
                "help": " ".join(help_text.split())[:400],
                **({"json_keys": schema} if schema is not None else {}),
                **({"value_facts": values} if values is not None else {}),
                **({"json_numbers": True} if kind == "json" and expands_numbers(action.type) else {}),
            }
        )
    out.sort(key=lambda o: o["dest"])
    return out, positionals


# --------------------------------------------------------------------------------------------------- source facts


def literal(node):
    try:
        return ast.literal_eval(node)
    except Exception:
        return None


GENERATE_TABLES = {
    "_TEXT_GENERATION_MODELS",
    "_MULTIMODAL_MODELS",
    "_TRANSFORMERS_SUPPORTED_MODELS",
    "_TRANSFORMERS_BACKEND_MODELS",
}
POOLING_TABLES = {
    "_EMBEDDING_MODELS",
    "_CROSS_ENCODER_MODELS",
    "_LATE_INTERACTION_MODELS",
    "_TOKEN_CLASSIFICATION_MODELS",
    "_SEQUENCE_CLASSIFICATION_MODELS",
    "_REWARD_MODELS",
}


def registry(root: pathlib.Path) -> dict:
    """Every architecture in vllm/model_executor/models/registry.py with the interfaces its class declares
    (read from the class bases, followed through the module's imports and parents), plus the architectures the
    release names as removed (``_PREVIOUSLY_SUPPORTED_MODELS``: arch -> last version) or moved to a plugin
    (``_OOT_SUPPORTED_MODELS``)."""
    src = (root / "model_executor/models/registry.py").read_text()
    tree = ast.parse(src)
    tables: dict[str, dict] = {}
    plain: dict[str, dict] = {}
    for node in tree.body:
        target = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            target, value = node.target.id, node.value
        if target and target.startswith("_") and target.endswith("_MODELS") and isinstance(value, ast.Dict):
            entries = {}
            for k, v in zip(value.keys, value.values):
                if k is None:  # **other_table
                    if isinstance(v, ast.Name) and v.id in tables:
                        entries.update(tables[v.id])
                    continue
                key = literal(k)
                val = literal(v)
                if isinstance(key, str) and isinstance(val, tuple) and len(val) >= 2:
                    entries[key] = (val[0], val[1])
                elif isinstance(key, str) and isinstance(val, str):
                    plain.setdefault(target, {})[key] = val
            tables[target] = entries
    index = ClassIndex(root)
    archs: dict[str, dict] = {}
    for table in tables:
        if table == "_VLLM_MODELS":
            continue
        for arch, (module, cls) in tables[table].items():
            entry = archs.get(arch)
            if entry is None:
                resolved = index.found(module, cls)
                ifaces = index.interfaces(module, cls) if resolved else set()
                entry = archs[arch] = {
                    "module": module,
                    "class": cls,
                    "tables": [],
                    "resolved": resolved,
                    # None = unknown (the class could not be read): never a reason to refuse
                    "supports_pp": ("SupportsPP" in ifaces) if resolved else None,
                    "multimodal": "SupportsMultiModal" in ifaces,
                    "hybrid": "IsHybrid" in ifaces,
                    "attention_free": "IsAttentionFree" in ifaces,
                    "supports_lora": "SupportsLoRA" in ifaces,
                    # Mamba state cached per block under prefix caching ("all" mode; else vLLM picks "align")
                    "supports_mamba_prefix_caching": ("SupportsMambaPrefixCaching" in ifaces) if resolved else None,
                    # sequence parallelism over the hidden states of TP ranks (--enable-hc-sp, from 0.33)
                    "supports_hc_sp": ("SupportsHCSP" in ifaces) if resolved else None,
                }
            entry["tables"].append(table.strip("_").lower())
            if table == "_MULTIMODAL_MODELS":
                entry["multimodal"] = True
    for entry in archs.values():
        names = {"_" + t.upper() for t in entry["tables"]}
        entry["generate"] = bool(names & GENERATE_TABLES)
        entry["pooling_only"] = not entry["generate"] and bool(names & POOLING_TABLES)
        entry["draft_only"] = names == {"_SPECULATIVE_DECODING_MODELS"}
    return {
        "architectures": archs,
        "tables": sorted(tables),
        "previously_supported": plain.get("_PREVIOUSLY_SUPPORTED_MODELS", {}),
        "out_of_tree": plain.get("_OOT_SUPPORTED_MODELS", {}),
    }


class ClassIndex:
    """Class name -> base names per module of vllm/model_executor/models, following ``from .x import Y`` and
    parent classes, so an architecture inherits the interfaces of the classes it extends."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        self.dir = root / "model_executor/models"
        self.cache: dict[str, tuple[dict, dict]] = {}

    def path_of(self, name: str) -> pathlib.Path:
        if name.startswith("vllm."):  # an absolute module (e.g. "vllm.models.deepseek_v32")
            base = self.root.joinpath(*name.split(".")[1:])
        else:  # a module of vllm/model_executor/models, dotted inside a package ("transformers.causal")
            base = self.dir.joinpath(*name.split("."))
        return base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"

    def module(self, name: str):
        if name in self.cache:
            return self.cache[name]
        path = self.path_of(name)
        classes: dict[str, list] = {}
        imports: dict[str, tuple[str, str]] = {}
        if path.exists():
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    classes[node.name] = [self._base_name(b) for b in node.bases] + self._declared(node)
                elif isinstance(node, ast.ImportFrom) and node.module:
                    mod = node.module
                    if node.level >= 1 and not name.startswith("vllm."):  # relative to its package of models/
                        parts = name.split(".")
                        pkg = parts[: len(parts) - node.level + (1 if path.name == "__init__.py" else 0)]
                        local = ".".join(pkg + [mod])
                    elif node.level >= 1:  # relative inside an absolute package
                        pkg = name.split(".")[
                            : len(name.split(".")) - node.level + (1 if path.name == "__init__.py" else 0)
                        ]
                        local = ".".join(pkg + [mod])
                    elif mod.startswith("vllm.model_executor.models."):  # a module, or one inside a package
                        local = ".".join(mod.split(".")[3:])
                    elif mod.startswith("vllm."):
                        local = mod
                    else:
                        local = None
                    for alias in node.names:
                        imports[alias.asname or alias.name] = (local, alias.name)
                elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    if isinstance(node.value, ast.Name):  # Alias = OtherClass
                        classes.setdefault(node.targets[0].id, [node.value.id])
        self.cache[name] = (classes, imports)
        return self.cache[name]

    @staticmethod
    def _declared(node: ast.ClassDef) -> list[str]:
        """``supports_lora = True`` in the class body: what vLLM's runtime-checkable SupportsLoRA protocol reads
        (vllm 0.33.0 model_executor/models/interfaces.py:760-795), so the class supports LoRA without the base."""
        for stmt in node.body:
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
            target = stmt.target if isinstance(stmt, ast.AnnAssign) else target
            value = getattr(stmt, "value", None)
            if (
                getattr(target, "id", None) == "supports_lora"
                and isinstance(value, ast.Constant)
                and value.value is True
            ):
                return ["SupportsLoRA"]
        return []

    @staticmethod
    def _base_name(b) -> str:
        if isinstance(b, ast.Name):
            return b.id
        if isinstance(b, ast.Attribute):
            return b.attr
        if isinstance(b, ast.Subscript):
            return ClassIndex._base_name(b.value)
        if isinstance(b, ast.Call):
            return ClassIndex._base_name(b.func)
        return "?"

    def found(self, module: str, cls: str) -> bool:
        classes, imports = self.module(module)
        return cls in classes or cls in imports

    def interfaces(self, module: str, cls: str, depth: int = 0) -> set[str]:
        if depth > 12:
            return set()
        classes, imports = self.module(module)
        out: set[str] = set()
        if cls in classes:
            for base in classes[cls]:
                out.add(base)
                if base in classes and base != cls:
                    out |= self.interfaces(module, base, depth + 1)
                elif base in imports and imports[base][0]:
                    out |= self.interfaces(imports[base][0], imports[base][1], depth + 1)
        elif cls in imports and imports[cls][0]:
            out |= self.interfaces(imports[cls][0], imports[cls][1], depth + 1)
        return out


def quantization(root: pathlib.Path) -> dict:
    """QuantizationMethods (a Literal in model_executor/layers/quantization/__init__.py) and, per method, the
    minimum capability and activation dtypes its config class declares (``get_min_capability`` /
    ``get_supported_act_dtypes`` returning constants)."""
    qdir = root / "model_executor/layers/quantization"
    init = (qdir / "__init__.py").read_text()
    tree = ast.parse(init)
    methods: list[str] = []
    deprecated: list[str] = []
    mapping: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            tgt = node.targets[0] if isinstance(node, ast.Assign) else node.target
            name = getattr(tgt, "id", None)
            if name == "QuantizationMethods" and isinstance(node.value, ast.Subscript):
                sl = node.value.slice
                elts = sl.elts if isinstance(sl, ast.Tuple) else [sl]
                methods = [literal(e) for e in elts if isinstance(literal(e), str)]
            elif name == "QUANTIZATION_METHODS" and isinstance(node.value, ast.List) and not methods:  # <= 0.7
                methods = [literal(e) for e in node.value.elts if isinstance(literal(e), str)]
            elif name in ("DEPRECATED_QUANTIZATION_METHODS",):
                v = literal(node.value)
                if isinstance(v, (list, tuple)):
                    deprecated = list(v)
        if isinstance(node, ast.FunctionDef) and node.name == "get_quantization_config":
            for sub in ast.walk(node):
                if isinstance(sub, ast.Dict):
                    for k, v in zip(sub.keys, sub.values):
                        key = literal(k) if k is not None else None
                        if isinstance(key, str) and isinstance(v, ast.Name):
                            mapping[key] = v.id
    # config class -> module
    imports: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level in (0, 1):
            for alias in node.names:
                imports[alias.asname or alias.name] = node.module.split(".")[-1] if node.level == 0 else node.module
    details = {}
    for m in methods:
        cls = mapping.get(m)
        info = {"config_class": cls, "min_capability": None, "act_dtypes": None}
        if cls:
            info.update(_quant_class_facts(qdir, imports.get(cls), cls))
        info["deprecated"] = m in deprecated
        details[m] = info
    return {"methods": methods, "deprecated": deprecated, "details": details}


def _quant_class_facts(qdir: pathlib.Path, module: str | None, cls: str) -> dict:
    out: dict = {}
    candidates = []
    if module:
        rel = module.replace(".", "/")
        candidates += [qdir / f"{rel}.py", qdir / rel / "__init__.py"]
    for path in candidates:
        if not path.exists():
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                for fn in node.body:
                    if isinstance(fn, ast.FunctionDef) and fn.name in (
                        "get_min_capability",
                        "get_supported_act_dtypes",
                    ):
                        for sub in ast.walk(fn):
                            if isinstance(sub, ast.Return) and sub.value is not None:
                                if fn.name == "get_min_capability":
                                    v = literal(sub.value)
                                    if isinstance(v, int):
                                        out["min_capability"] = v
                                else:
                                    if isinstance(sub.value, ast.List):
                                        names = [e.attr for e in sub.value.elts if isinstance(e, ast.Attribute)]
                                        if names:
                                            out["act_dtypes"] = names
                                break
        break
    return out


def cache_dtypes(root: pathlib.Path) -> list[str]:
    for rel in ("config/cache.py",):
        p = root / rel
        if not p.exists():
            continue
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                tgt = node.targets[0] if isinstance(node, ast.Assign) else node.target
                if getattr(tgt, "id", None) == "CacheDType" and isinstance(node.value, ast.Subscript):
                    sl = node.value.slice
                    elts = sl.elts if isinstance(sl, ast.Tuple) else [sl]
                    return [literal(e) for e in elts if isinstance(literal(e), str)]
    return []


# ------------------------------------------------------------------------------------------------------ the parser


def serve_parser_modules() -> list[str]:
    """Where ``vllm serve`` takes make_arg_parser from in this release (read from vllm/entrypoints/cli/serve.py:
    the module moved between releases)."""
    spec = importlib.util.find_spec("vllm")
    path = pathlib.Path(spec.origin).parent / "entrypoints" / "cli" / "serve.py"
    if not path.exists():
        return []
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and any(a.name == "make_arg_parser" for a in node.names):
            out.append(node.module)
    return out


def build_serve_parser():
    """The parser of ``vllm serve``: FlexibleArgumentParser + the serve subcommand's make_arg_parser, with the
    positional model tag the subcommand adds (vllm/entrypoints/cli/main.py, cli/serve.py)."""
    if importlib.util.find_spec("torch") is None:
        mock("vllm._C")
        mock("vllm.model_executor.custom_op", MagicMock(CustomOp=MockCustomOp))
        mock("torch.nn", MagicMock(Parameter=object, Module=object))
    real_version = importlib.metadata.version

    def version(name):
        try:
            return real_version(name)
        except importlib.metadata.PackageNotFoundError:
            return "99.0.0"

    importlib.metadata.version = version
    for mod in ("vllm.utils.argparse_utils", "vllm.utils"):  # moved to argparse_utils in 0.11
        try:
            FlexibleArgumentParser = auto_import(mod, "FlexibleArgumentParser")
            break
        except (ImportError, AttributeError):
            continue
    else:
        raise ImportError("FlexibleArgumentParser not found")
    for mod in (*serve_parser_modules(), "vllm.entrypoints.common.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            make = auto_import(mod, "make_arg_parser")
            break
        except (ImportError, AttributeError):
            continue
    else:
        raise ImportError("make_arg_parser not found")
    parser = FlexibleArgumentParser(prog="vllm serve")
    for _ in range(200):
        try:
            config = auto_import("vllm.config")
            guard = (
                patch("vllm.config.DeviceConfig.__post_init__")
                if hasattr(getattr(config, "DeviceConfig", None), "__post_init__")
                else nullcontext()
            )
            with guard:
                parser = make(FlexibleArgumentParser(prog="vllm serve")) or parser
            break
        except ModuleNotFoundError as e:
            mock(e.name)
    # the serve subcommand's positional (cli/serve.py / cli/main.py): model_tag
    return parser


def defaults(root: pathlib.Path) -> dict:
    """Defaults Preflight mirrors, read by instantiating vLLM's own dataclasses where they are plain."""
    out = {}
    try:
        CacheConfig = auto_import("vllm.config", "CacheConfig")
        for f in CacheConfig.__dataclass_fields__.values():
            if f.name in ("gpu_memory_utilization", "block_size", "cache_dtype", "enable_prefix_caching"):
                d = f.default
                d = getattr(d, "default", d)  # pydantic Field(default=..., ...) inside a pydantic dataclass
                if d is not dataclass_missing() and not isinstance(d, MagicMock):
                    out[f.name] = jsonable(d)
    except Exception:  # pragma: no cover - reported in the output
        out["unavailable"] = "CacheConfig is not a dataclass in this release (defaults come from the options)"
    return out


def batch_defaults() -> dict | None:
    """``vllm serve`` scheduler defaults by GPU (EngineArgs.get_batch_defaults, 0.11+): called with the platform
    stubbed to report each sample GPU's total memory and name; the API server's values are kept."""
    EngineArgs = auto_import("vllm.engine.arg_utils", "EngineArgs")
    if not hasattr(EngineArgs, "get_batch_defaults"):
        return None
    UsageContext = auto_import("vllm.usage.usage_lib", "UsageContext")
    samples = {
        "200gib-b200": (200, "NVIDIA B200"),
        "80gib-h100": (80, "NVIDIA H100 80GB HBM3"),
        "80gib-a100": (80, "NVIDIA A100-SXM4-80GB"),
        "48gib-l40s": (48, "NVIDIA L40S"),
        "24gib-l4": (24, "NVIDIA L4"),
    }
    out = {}
    for key, (gib, name) in samples.items():
        platform = MagicMock()
        platform.get_device_total_memory.return_value = gib * (1 << 30)
        platform.get_device_name.return_value = name
        platform.is_device_capability.return_value = False
        platform.is_tpu.return_value = False
        platform.is_cpu.return_value = False
        with patch("vllm.engine.arg_utils.current_platform", platform):
            tokens, seqs = EngineArgs.get_batch_defaults(world_size=1)
        out[key] = {
            "memory_gib": gib,
            "device_name": name,
            "max_num_batched_tokens": tokens[UsageContext.OPENAI_API_SERVER],
            "max_num_seqs": seqs[UsageContext.OPENAI_API_SERVER],
        }
    return out


LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


def transformers_length_defaults() -> dict:
    """The length keys a Transformers config class sets by default, per model_type: vLLM reads config.json through
    these classes, so a key missing from the file still has its class default (FalconConfig:
    max_position_embeddings=2048). From the Transformers installed next to vLLM here."""
    try:
        import transformers
        from transformers import CONFIG_MAPPING
    except Exception:  # pragma: no cover
        return {}
    out = {}
    for model_type in sorted(CONFIG_MAPPING.keys()):
        try:
            cfg = CONFIG_MAPPING[model_type]()
        except Exception:
            continue
        found = {
            k: getattr(cfg, k)
            for k in LENGTH_KEYS
            if isinstance(getattr(cfg, k, None), int) and not isinstance(getattr(cfg, k), bool)
        }
        if found:
            out[model_type] = found
    return {"transformers_version": transformers.__version__, "by_model_type": out}


def dataclass_missing():
    import dataclasses

    return dataclasses.MISSING


def parser_facts(parser: argparse.ArgumentParser, root: pathlib.Path) -> dict:
    """scripts/vllm_argparse.py's facts, with the built parser's own ``allow_abbrev`` and help option strings (what
    argparse matches a prefix against besides the options)."""
    facts = argparse_facts(root.parent)
    helps = [s for s, a in parser._option_string_actions.items() if isinstance(a, argparse._HelpAction)]
    return {
        **facts,
        "allow_abbrev": bool(facts["allow_abbrev"] and parser.allow_abbrev),
        "help_option_strings": sorted(helps),
        "read_from": "parser",
    }


def main() -> None:
    # no network: a config class that would fetch a model while probed stays unjudged, the same on every run
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # the catalogue alone on stdout: what vLLM logs while its classes are built and probed goes to stderr
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    root = pathlib.Path(importlib.util.find_spec("vllm").origin).parent
    version = importlib.metadata.version("vllm")
    parser = build_serve_parser()
    opts, positionals = options(parser, EngineArgsSource())
    json.dump(
        {
            "vllm_version": version,
            "argparse": parser_facts(parser, root),
            "options": opts,
            "positionals": positionals,
            "registry": registry(root),
            "quantization": quantization(root),
            "kv_cache_dtypes": cache_dtypes(root),
            "transformers_length_defaults": transformers_length_defaults(),
            "defaults": {**defaults(root), "scheduler_by_gpu": batch_defaults()},
            "mocked_modules": sorted(set(MOCKED)),
        },
        out,
        indent=1,
        sort_keys=True,
    )
    out.flush()


if __name__ == "__main__":
    main()
