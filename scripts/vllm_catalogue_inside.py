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
import pathlib
import sys
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


def key_schema(cls, depth: int = 0):
    """The keys a JSON value may hold for a config dataclass that forbids extra keys: ``{field: sub-schema or None}``
    (a nested config dataclass gets its own schema); None where extra keys are allowed or the class is unreadable."""
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
                sub = key_schema(arg, depth + 1)
                break
        out[f.name] = sub
    return {"keys": out}


def options(parser: argparse.ArgumentParser) -> tuple[list[dict], list[dict]]:
    out, positionals = [], []
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
        schema = key_schema(dataclass_of(action.type)) if kind == "json" else None
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
        else:
            base = self.dir / name
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
                    classes[node.name] = [self._base_name(b) for b in node.bases]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    mod = node.module
                    if node.level == 1 and not name.startswith("vllm."):
                        local = mod.split(".")[0]
                    elif node.level >= 1:  # relative inside an absolute package
                        pkg = name.split(".")[
                            : len(name.split(".")) - node.level + (1 if path.name == "__init__.py" else 0)
                        ]
                        local = ".".join(pkg + [mod])
                    elif mod.startswith("vllm.model_executor.models."):
                        local = mod.split(".")[3]
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
    root = pathlib.Path(importlib.util.find_spec("vllm").origin).parent
    version = importlib.metadata.version("vllm")
    parser = build_serve_parser()
    opts, positionals = options(parser)
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
        sys.stdout,
        indent=1,
        sort_keys=True,
    )


if __name__ == "__main__":
    main()
