"""What a launch can make vLLM load, read from a release's own source: for every engine option, every field of the
config dataclasses behind its JSON options (nested, list items included) and every environment variable vLLM reads,
whether its value reaches

- ``import``: an import by module or qualified name (``importlib.import_module``, ``resolve_obj_by_qualname``,
  ``__import__``, a file executed as a module, ``logging.config.dictConfig`` — whose factories call any callable),
- ``unpickle``: ``pickle``/``cloudpickle`` loads, ``torch.load`` without ``weights_only=True``,
- ``read`` / ``write``: a file opened for reading or writing, a directory made,
- ``download_dir``: where the Hub or a loader downloads to,
- ``other_weights``: another model, tokenizer or adapter named by the value (``from_pretrained``, ``snapshot_download``…).

    python scripts/vllm_loading.py RELEASE_DIR        # the unpacked wheel: RELEASE_DIR/vllm/…; JSON on stdout

Nothing is imported: every ``.py`` file of the release is parsed (``ast``) and a field's value is followed, within a
function, through assignments, string operations, path joins, ``.get("key")`` and ``[...]`` (nested keys), loops over
lists (``[]``) and ``self.attr`` stores; across functions through the parameters of functions whose name is defined in
few places; and into nested configs built with ``ConfigClass(**value)`` (MultiConnector's ``connectors`` list items
are ``KVTransferConfig``s). Each fact carries the file and line of the call that loads. The analysis over-approximates
within those rules and misses what flows through other objects; the flows it cannot see are in ``REVIEWED`` (read
by hand, with file and line), merged into the output with ``"reviewed": true``.
"""

from __future__ import annotations

import ast
import json
import pathlib
import sys
from collections import defaultdict
from dataclasses import dataclass, field

# -- sinks ------------------------------------------------------------------------------------------------------------
# call name (the dotted name as written, or its last part for methods) -> (kind, which arguments carry the value)
IMPORT_CALLS = {
    "import_module": (0, "name"),
    "resolve_obj_by_qualname": (0, "qualname"),
    "__import__": (0, "name"),
    "spec_from_file_location": (1, "location"),
    "run_path": (0, "path_name"),
    "dictConfig": (0, "config"),
    "load_plugins_by_group": (0, "group"),
    "locate": (0, "path"),
}
UNPICKLE_CALLS = {
    "pickle.load": 0,
    "pickle.loads": 0,
    "cloudpickle.load": 0,
    "cloudpickle.loads": 0,
    "torch.load": 0,
    "joblib.load": 0,
}
DOWNLOAD_KWARGS = ("cache_dir", "local_dir", "download_dir")
OTHER_WEIGHTS_CALLS = {
    "from_pretrained": 0,
    "snapshot_download": 0,
    "hf_hub_download": 0,
    "get_tokenizer": 0,
    "get_config": 0,
    "cached_tokenizer_from_config": None,
    "download_weights_from_hf": 0,
}
# keyword arguments that carry a credential (the Hub's token, an API key): a value reaching one is a secret
SECRET_KWARGS = {"token", "hf_token", "use_auth_token", "api_key", "password"}
ENV = "env:"  # label prefix of a value read from an environment variable
ENVS_MODULES = {"envs", "vllm.envs"}  # ``envs.VLLM_X``: vLLM's own variables, read through vllm/envs.py
ENVIRON = {"os.environ", "environ"}
WRITE_METHODS = {"write_text", "write_bytes", "mkdir", "touch"}
READ_METHODS = {"read_text", "read_bytes"}
FS_WRITE_CALLS = {
    "os.makedirs": 0,
    "os.mkdir": 0,
    "torch.save": 1,
    "shutil.copy": 1,
    "shutil.copyfile": 1,
    "shutil.move": 1,
    "np.save": 0,
    "numpy.save": 0,
}
# calls whose result carries the value of their arguments (strings and paths built from it)
PASS_THROUGH = {
    "str",
    "os.fspath",
    "os.path.join",
    "os.path.expanduser",
    "os.path.abspath",
    "os.path.realpath",
    "os.path.normpath",
    "os.path.dirname",
    "Path",
    "pathlib.Path",
    "PurePath",
    "join",
    "format",
    "strip",
    "rstrip",
    "lstrip",
    "split",
    "rsplit",
    "partition",
    "rpartition",
    "replace",
    "lower",
    "upper",
    "removeprefix",
    "removesuffix",
    "expanduser",
    "resolve",
    "absolute",
    "joinpath",
    "with_suffix",
    "with_name",
    "list",
    "tuple",
    "dict",
    "copy",
    "deepcopy",
    "json.loads",
    "loads",
    "get",
    "items",
    "values",
    "keys",
    "cast",
}
# names too common to follow by name across the codebase
COMMON = {
    "__init__",
    "get",
    "load",
    "run",
    "call",
    "forward",
    "apply",
    "update",
    "build",
    "create",
    "make",
    "init",
    "setup",
    "start",
    "stop",
    "close",
    "open",
    "read",
    "write",
    "parse",
    "process",
    "execute",
    "main",
    "from_config",
    "from_dict",
    "to_dict",
    "__call__",
    "__post_init__",
    "validate",
    "verify",
    "compute_hash",
    "encode",
    "decode",
}
MAX_DEFS = 4  # a called name defined in more places than this is not followed
# names the entry points give the parsed command line (an argparse Namespace or EngineArgs): their attributes are the
# options themselves
ARGS_NAMES = {"args", "cli_args", "parsed_args", "engine_args", "server_args", "frontend_args", "ns"}
OPTIONS = "Options"
ARGS_CLASSES = ("EngineArgs", "AsyncEngineArgs", "FrontendArgs")  # the classes whose fields are `vllm serve`'s options

# Flows the analysis cannot see (through objects, registries or other libraries), read by hand in 0.33.0: (what is
# set, kind, file, the text that marks the site in that file, why). What is set is an option path (a JSON option's
# nested keys joined by ".", list items as "[]") or "env:NAME". Each release is searched for the text, so the line
# cited is that release's; an entry whose file or text a release lacks is not part of that release's facts. A file
# outside vLLM (torch, Triton) is cited as its library documents it, with no text to find.
REVIEWED: list[tuple[str, str, str, str | None, str]] = [
    (
        "trust_remote_code",
        "import",
        "vllm/transformers_utils/config.py",
        "trust_remote_code=trust_remote_code",
        "Transformers imports the model repository's own Python modules",
    ),
    (
        "compilation_config.backend",
        "import",
        "vllm/config/compilation.py",
        "resolve_obj_by_qualname(self.backend)",
        "with mode 1 or 2 a backend that is not a registered name is resolved by qualified name",
    ),
    (
        "model_class_overrides",
        "import",
        "vllm/config/model.py",
        "ModelRegistry.register_model(arch, target)",
        "architecture -> module:Class overrides are registered and imported when the model class is resolved",
    ),
    (
        "logits_processors",
        "import",
        "vllm/v1/sample/logits_processor/__init__.py",
        "FQCN",
        "each entry is a fully qualified class name that is imported",
    ),
    (
        "compilation_config.inductor_compile_config",
        "import",
        "vllm/compilation/backends.py",
        "deepcopy(self.compilation_config.inductor_compile_config)",
        "torch._inductor's config: keys such as cpp.cxx name a compiler to run, custom passes are imported",
    ),
    (
        "log_config_file",
        "import",
        "vllm/entrypoints/launchers/utils/server_utils.py",
        "def load_log_config",
        "the file is a logging dictConfig for uvicorn, whose factories ('()') import and call any callable",
    ),
    (
        "log_config_file",
        "import",
        "vllm/entrypoints/openai/api_server.py",
        "log_config_file",
        "the file is a logging dictConfig for uvicorn, whose factories ('()') import and call any callable",
    ),
    (
        "logging_config.pylogging_config_file",
        "import",
        "vllm/logger.py",
        "dictConfig(",
        "the file is a logging dictConfig, whose factories ('()') import and call any callable",
    ),
    (
        "env:VLLM_LOGGING_CONFIG_PATH",
        "import",
        "vllm/logger.py",
        "dictConfig(",
        "the file is a logging dictConfig, whose factories ('()') import and call any callable",
    ),
    (
        "compilation_config.debug_dump_path",
        "write",
        "vllm/config/vllm.py",
        "compilation_config.debug_dump_path =",
        "compiled graphs and artefacts are dumped under this directory",
    ),
    (
        "lora_modules",
        "other_weights",
        "vllm/entrypoints/serve/utils/api_utils.py",
        "def process_lora_modules",
        "each name=path adapter is loaded with the model",
    ),
    (
        "api_key",
        "secret",
        "vllm/entrypoints/serve/middleware/register.py",
        "args.api_key",
        "the bearer token every request must present",
    ),
    (
        "api_key",
        "secret",
        "vllm/entrypoints/openai/api_server.py",
        "args.api_key",
        "the bearer token every request must present",
    ),
    ("hf_token", "secret", "vllm/config/model.py", "hf_token:", "the Hugging Face token used for gated downloads"),
    (
        "env:VLLM_API_KEY",
        "secret",
        "vllm/entrypoints/serve/middleware/register.py",
        "envs.VLLM_API_KEY",
        "the bearer token every request must present",
    ),
    (
        "env:VLLM_API_KEY",
        "secret",
        "vllm/entrypoints/openai/api_server.py",
        "envs.VLLM_API_KEY",
        "the bearer token every request must present",
    ),
    ("env:HF_TOKEN", "secret", "huggingface_hub/constants.py (Hub docs)", None, "the Hugging Face token"),
    (
        "env:VLLM_SERVER_DEV_MODE",
        "safety_off",
        "vllm/entrypoints/launchers/api_server/routers.py",
        "envs.VLLM_SERVER_DEV_MODE",
        "development endpoints (cache resets, sleep, collective RPC) on the API port",
    ),
    (
        "env:VLLM_SERVER_DEV_MODE",
        "safety_off",
        "vllm/entrypoints/openai/api_server.py",
        "envs.VLLM_SERVER_DEV_MODE",
        "development endpoints (cache resets, sleep, collective RPC) on the API port",
    ),
    (
        "env:VLLM_ALLOW_INSECURE_SERIALIZATION",
        "unpickle",
        "vllm/v1/serial_utils.py",
        "envs.VLLM_ALLOW_INSECURE_SERIALIZATION",
        "messages between processes may carry pickles, which are loaded",
    ),
    (
        "env:VLLM_ALLOW_RUNTIME_LORA_UPDATING",
        "safety_off",
        "vllm/entrypoints/serve/lora/api_router.py",
        "envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING",
        "any API client may load an adapter from any path or repository",
    ),
    (
        "env:VLLM_ALLOW_RUNTIME_LORA_UPDATING",
        "safety_off",
        "vllm/entrypoints/openai/api_server.py",
        "envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING",
        "any API client may load an adapter from any path or repository",
    ),
    *(
        (
            "allowed_local_media_path",
            "read",
            rel,
            "Path(allowed_local_media_path)",
            "API requests may read any file "
            "under this directory (file:// media URLs), so its content reaches the model and the response",
        )
        for rel in ("vllm/multimodal/media/connector.py", "vllm/multimodal/utils.py")
    ),
    *(
        (name, "read", rel, f"{name}=args.{name}", "uvicorn reads the TLS key, certificate or CA bundle at this path")
        for name in ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs")
        for rel in ("vllm/entrypoints/launchers/api_server/entry.py", "vllm/entrypoints/openai/api_server.py")
    ),
    *(
        ("uds", "write", rel, "create_server_unix_socket(args.uds)", "the server binds a Unix socket at this path")
        for rel in ("vllm/entrypoints/launchers/launcher.py", "vllm/entrypoints/openai/api_server.py")
    ),
    # mm_processor_kwargs are laid over the processor's from_pretrained keywords (get_allowed_kwarg_only_overrides
    # with allow_var_kwargs), so Transformers' own loading keywords pass through
    *(
        (what, kind, "vllm/transformers_utils/processor.py", "**_merge_mm_kwargs(model_config", why)
        for what, kind, why in (
            ("mm_processor_kwargs.token", "secret", "the Hugging Face token the processor is downloaded with"),
            ("mm_processor_kwargs.cache_dir", "download_dir", "the processor's files are downloaded there"),
            ("mm_processor_kwargs.cache_dir", "write", "the processor's files are downloaded there"),
        )
    ),
    (
        "env:VLLM_LOGGING_STREAM",
        "import",
        "vllm/logger.py",
        'vllm_handler["stream"] = envs.VLLM_LOGGING_STREAM',
        "the handler's stream in a logging dictConfig: an ext://module.attr value is imported",
    ),
    (
        "env:TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",
        "unpickle",
        "torch/serialization.py (torch.load docs)",
        None,
        "every torch.load unpickles, whatever weights_only its caller asked for",
    ),
    (
        "env:TRITON_CACHE_MANAGER",
        "import",
        "triton/runtime/cache.py (Triton docs)",
        None,
        "module:Class of the cache manager, imported",
    ),
    (
        "env:TRITON_REMOTE_CACHE_BACKEND",
        "import",
        "triton/runtime/cache.py (Triton docs)",
        None,
        "module:Class of the remote cache backend, imported",
    ),
]


def reviewed_facts(root: pathlib.Path) -> dict[str, set[Fact]]:
    """REVIEWED as this release has it: each entry whose file holds its text, cited at that text's first line."""
    out: dict[str, set[Fact]] = defaultdict(set)
    for what, kind, rel, needle, why in REVIEWED:
        if needle is None:
            out[what].add(Fact(kind, rel, why, True))
            continue
        path = root / rel
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.exists() else []
        line = next((i for i, text in enumerate(lines, 1) if needle in text), None)
        if line is not None:
            out[what].add(Fact(kind, f"{rel}:{line}", why, True))
    return out


@dataclass(frozen=True)
class Fact:
    kind: str
    site: str  # release-relative file:line of the call that loads
    via: str = ""  # the function a parameter carried the value into (or, reviewed, why), when not the call itself
    reviewed: bool = False


# -- the release's config classes -------------------------------------------------------------------------------------
def annotation_names(node: ast.expr | None) -> set[str]:
    """Every simple name inside an annotation (``KVTransferConfig | None`` -> {KVTransferConfig, None})."""
    if node is None:
        return set()
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return set()
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


@dataclass
class Classes:
    """Config dataclasses: name -> {field: annotation names}; the VllmConfig attribute of each (``kv_transfer_config``
    -> ``KVTransferConfig``); EngineArgs' and the frontend's fields (the options' dests)."""

    fields: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    attr_of: dict[str, str] = field(default_factory=dict)  # VllmConfig attribute -> class
    options: dict[str, set[str]] = field(default_factory=dict)  # option dest -> annotation names

    def field_class(self, cls: str, name: str) -> str | None:
        """The config class a field of ``cls`` holds, if any."""
        for n in self.fields.get(cls, {}).get(name, ()):
            if n in self.fields:
                return n
        return None


def read_classes(modules: dict[str, ast.Module]) -> Classes:
    """The config dataclasses (``vllm/config``) and the command line's argument classes (``*Args`` in the engine and
    the entry points), each with its base classes' fields."""
    out = Classes()
    bases: dict[str, list[str]] = {}
    for rel, tree in modules.items():
        config = rel.startswith("vllm/config/") or rel == "vllm/config.py"  # a package from 0.7, one module before
        if not (config or rel.startswith(("vllm/engine/", "vllm/entrypoints/"))):
            continue
        for node in tree.body:
            if not isinstance(node, ast.ClassDef) or not (config or node.name.endswith("Args")):
                continue
            body = {
                s.target.id: annotation_names(s.annotation)
                for s in node.body
                if isinstance(s, ast.AnnAssign)
                and isinstance(s.target, ast.Name)
                and "ClassVar" not in annotation_names(s.annotation)
            }
            if body or node.name.endswith("Args"):
                out.fields.setdefault(node.name, {}).update(body)
                bases[node.name] = [dotted(b).rsplit(".", 1)[-1] for b in node.bases]
    for name in list(out.fields):
        seen, todo = set(), list(bases.get(name, ()))
        while todo:
            base = todo.pop()
            if base in seen or base not in out.fields:
                continue
            seen.add(base)
            for k, v in out.fields[base].items():
                out.fields[name].setdefault(k, v)
            todo.extend(bases.get(base, ()))
    for attr, names in out.fields.get("VllmConfig", {}).items():
        for n in names:
            if n in out.fields:
                out.attr_of[attr] = n
    for cls in ARGS_CLASSES:
        for name, names in out.fields.get(cls, {}).items():
            out.options[name] = names
    for rel, tree in modules.items():  # options added to the parser by hand (the frontend's, before FrontendArgs)
        if rel.startswith(("vllm/engine/", "vllm/entrypoints/")):
            for dest in argparse_dests(tree):
                out.options.setdefault(dest, set())
    out.fields[OPTIONS] = dict(out.options)
    return out


def argparse_dests(tree: ast.Module) -> set[str]:
    """The dest of every ``add_argument("--long-name", …)`` call: ``dest=`` or the long name with ``_``."""
    out = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and dotted(node.func).endswith("add_argument")):
            continue
        dest = next(
            (k.value.value for k in node.keywords if k.arg == "dest" and isinstance(k.value, ast.Constant)), None
        )
        longs = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
        if isinstance(dest, str):
            out.add(dest)
        elif longs:
            out.add(str(longs[0])[2:].replace("-", "_"))
    return out


def unique_fields(classes: Classes) -> dict[str, set[str]]:
    """Field names specific enough to name their field wherever they are read (at most three config classes have
    them, and they are long compound names: ``mm_encoder_fp8_scale_save_path``, not ``model``): field -> classes."""
    seen: dict[str, set[str]] = defaultdict(set)
    for cls, fields in classes.fields.items():
        if cls in ARGS_CLASSES or cls == OPTIONS or cls.endswith("Args"):
            continue
        for name in fields:
            seen[name].add(cls)
    return {
        name: owners for name, owners in seen.items() if len(owners) <= 3 and name.count("_") >= 2 and len(name) >= 14
    }


# -- taint within one function ----------------------------------------------------------------------------------------
def dotted(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


class Scope(ast.NodeVisitor):
    """One function: the labels each local name carries, the facts its calls reach, the parameters that reach a
    load (its summary) and the nested configs it builds (``ConfigClass(**value)``)."""

    def __init__(self, analysis: Analysis, rel: str, cls: str | None, fn: ast.FunctionDef | ast.AsyncFunctionDef):
        self.a, self.rel, self.cls, self.fn = analysis, rel, cls, fn
        self.names: dict[str, set[str]] = defaultdict(set)
        self.types: dict[str, str] = {}
        self.declared_global = {n for g in ast.walk(fn) if isinstance(g, ast.Global) for n in g.names}
        args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        for arg in args:
            self.names[arg.arg].add(f"param:{arg.arg}")
            t = next((n for n in annotation_names(arg.annotation) if n in analysis.classes.fields), None)
            if t:
                self.types[arg.arg] = t
        if cls in analysis.classes.fields and args:
            self.types[args[0].arg] = cls

    # types of receivers: which config class an expression holds
    def type_of(self, node: ast.expr) -> str | None:
        c = self.a.classes
        if isinstance(node, ast.Name):
            if node.id in ARGS_NAMES and node.id not in self.types:
                return OPTIONS
            return self.types.get(node.id) or c.attr_of.get(node.id)
        if isinstance(node, ast.Attribute):
            if node.attr in c.attr_of:
                return c.attr_of[node.attr]
            owner = self.type_of(node.value)
            return c.field_class(owner, node.attr) if owner else None
        if isinstance(node, ast.BoolOp):
            return next((t for t in map(self.type_of, node.values) if t), None)
        if isinstance(node, ast.Call) and dotted(node.func).rsplit(".", 1)[-1] in c.fields:
            return dotted(node.func).rsplit(".", 1)[-1]
        return None

    def labels(self, node: ast.expr | None) -> set[str]:
        if node is None:
            return set()
        if isinstance(node, ast.Name):
            if node.id in self.names:
                return set(self.names[node.id])
            return set(self.a.globals.get((self.rel, node.id), ()))
        if isinstance(node, ast.Attribute):
            if dotted(node.value) in ENVS_MODULES and node.attr.isupper():
                return {f"{ENV}{node.attr}"}
            owner = self.type_of(node.value)
            if owner and node.attr in self.a.classes.fields[owner]:
                return {f"{owner}.{node.attr}"}
            if node.attr in self.a.unique:
                return {f"{owner}.{node.attr}" for owner in self.a.unique[node.attr]}
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls") and self.cls:
                return set(self.a.attrs.get((self.cls, node.attr), ()))
            return {f"{lab}.{node.attr}" for lab in self.labels(node.value) if not lab.startswith("param:")} | {
                lab for lab in self.labels(node.value) if lab.startswith("param:")
            }
        if isinstance(node, ast.Subscript):
            if dotted(node.value) in ENVIRON and isinstance(node.slice, ast.Constant):
                return {f"{ENV}{node.slice.value}"}
            key = node.slice.value if isinstance(node.slice, ast.Constant) else None
            return {f"{lab}.{key}" if isinstance(key, str) else f"{lab}[]" for lab in self.labels(node.value)}
        if isinstance(node, ast.Call):
            return self.call_labels(node)
        if isinstance(
            node,
            (
                ast.JoinedStr,
                ast.FormattedValue,
                ast.BinOp,
                ast.BoolOp,
                ast.IfExp,
                ast.Tuple,
                ast.List,
                ast.Starred,
                ast.Await,
                ast.NamedExpr,
            ),
        ):
            out: set[str] = set()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr) and not (isinstance(node, ast.IfExp) and child is node.test):
                    out |= self.labels(child)
            return out
        return set()

    def call_labels(self, node: ast.Call) -> set[str]:
        name = dotted(node.func)
        last = name.rsplit(".", 1)[-1]
        if (
            last == "get"
            and isinstance(node.func, ast.Attribute)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            key = node.args[0].value
            if dotted(node.func.value) in ENVIRON:
                return {f"{ENV}{key}"}
            return {f"{lab}.{key}" for lab in self.labels(node.func.value)}
        if name in ("os.getenv", "getenv") and node.args and isinstance(node.args[0], ast.Constant):
            return {f"{ENV}{node.args[0].value}"}
        if name in PASS_THROUGH or last in PASS_THROUGH:
            out = set()
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                out |= self.labels(arg)
            if isinstance(node.func, ast.Attribute):
                out |= self.labels(node.func.value)
            return out
        return set()

    # statements
    def assign(self, target: ast.expr, labels: set[str], value: ast.expr | None = None) -> None:
        if isinstance(target, ast.Name) and target.id in self.declared_global:
            self.a.globals[(self.rel, target.id)] |= {lab for lab in labels if not lab.startswith("param:")}
        elif isinstance(target, ast.Name):
            self.names[target.id] |= labels
            t = self.type_of(value) if value is not None else None
            if t:
                self.types[target.id] = t
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self.assign(elt, labels)
        elif (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
            and self.cls
            and labels
        ):
            self.a.attrs[(self.cls, target.attr)] |= {lab for lab in labels if not lab.startswith("param:")}

    def visit_Assign(self, node: ast.Assign) -> None:
        labels = self.labels(node.value)
        for target in node.targets:
            self.assign(target, labels, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.assign(node.target, self.labels(node.value), node.value)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.assign(node.target, self.labels(node.value))
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        self.assign(node.target, {f"{lab}[]" for lab in self.labels(node.iter)})
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self.assign(node.target, {f"{lab}[]" for lab in self.labels(node.iter)})
        self.generic_visit(node)

    def visit_With(self, node: ast.With) -> None:
        for item in node.items:
            if item.optional_vars is not None:
                self.assign(item.optional_vars, self.labels(item.context_expr))
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node is self.fn:
            self.generic_visit(node)  # nested functions are scopes of their own

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self.a.sinks(self, node)
        self.generic_visit(node)

    def site(self, node: ast.AST) -> str:
        return f"{self.rel}:{node.lineno}"


# -- the whole release ------------------------------------------------------------------------------------------------
class Analysis:
    def __init__(self, modules: dict[str, ast.Module]):
        self.modules = modules
        self.classes = read_classes(modules)
        self.attrs: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.globals: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.facts: dict[str, set[Fact]] = defaultdict(set)
        self.summaries: dict[str, dict[str, set[Fact]]] = defaultdict(lambda: defaultdict(set))
        self.aliases: dict[str, set[str]] = defaultdict(set)  # label -> config classes built from it
        self.defs: dict[str, list[tuple[str, str | None, ast.FunctionDef | ast.AsyncFunctionDef]]] = defaultdict(list)
        for rel, tree in modules.items():
            local = {}
            for cls, fn in functions(tree):
                self.defs[fn.name].append((rel, cls, fn))
                local.setdefault(fn.name, (rel, cls, fn))
            for node in tree.body:  # X = lru_cache(f): a call of X is a call of f
                if (
                    isinstance(node, ast.Assign)
                    and isinstance(node.value, ast.Call)
                    and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                ):
                    for a in node.value.args:
                        if isinstance(a, ast.Name) and a.id in local:
                            self.defs[node.targets[0].id].append(local[a.id])
        self.unique = unique_fields(self.classes)

    def run(self, rounds: int = 3) -> None:
        for _ in range(rounds):
            before = (
                sum(len(v) for v in self.facts.values()),
                sum(len(p) for s in self.summaries.values() for p in s.values()),
            )
            for defs in self.defs.values():
                for rel, cls, fn in defs:
                    Scope(self, rel, cls, fn).visit(fn)
            after = (
                sum(len(v) for v in self.facts.values()),
                sum(len(p) for s in self.summaries.values() for p in s.values()),
            )
            if after == before:
                return

    def record(self, scope: Scope, labels: set[str], fact: Fact) -> None:
        for lab in labels:
            if lab.startswith("param:"):
                self.summaries[scope.fn.name][lab[6:].split(".", 1)[0]].add(fact)
            else:
                self.facts[lab].add(fact)

    def sinks(self, scope: Scope, node: ast.Call) -> None:
        name = dotted(node.func)
        last = name.rsplit(".", 1)[-1]
        site = scope.site(node)
        arg = lambda i, kw=None: (  # noqa: E731
            node.args[i]
            if i is not None and len(node.args) > i
            else next((k.value for k in node.keywords if k.arg == kw), None)
        )
        if last in IMPORT_CALLS:
            i, kw = IMPORT_CALLS[last]
            self.record(scope, scope.labels(arg(i, kw)), Fact("import", site))
        if name in UNPICKLE_CALLS and not _weights_only(node):
            self.record(scope, scope.labels(arg(UNPICKLE_CALLS[name], "f")), Fact("unpickle", site))
        if name in ("open", "io.open", "builtins.open"):
            mode = arg(1, "mode")
            writes = (
                isinstance(mode, ast.Constant) and isinstance(mode.value, str) and any(c in mode.value for c in "wax+")
            )
            self.record(scope, scope.labels(arg(0, "file")), Fact("write" if writes else "read", site))
        if isinstance(node.func, ast.Attribute) and last in WRITE_METHODS | READ_METHODS:
            self.record(scope, scope.labels(node.func.value), Fact("write" if last in WRITE_METHODS else "read", site))
        if name in FS_WRITE_CALLS:
            self.record(scope, scope.labels(arg(FS_WRITE_CALLS[name])), Fact("write", site))
        for k in node.keywords:
            if k.arg in DOWNLOAD_KWARGS:
                self.record(scope, scope.labels(k.value), Fact("download_dir", site))
            if k.arg in SECRET_KWARGS:
                self.record(scope, scope.labels(k.value), Fact("secret", site))
        if last in OTHER_WEIGHTS_CALLS and OTHER_WEIGHTS_CALLS[last] is not None:
            self.record(
                scope,
                scope.labels(arg(OTHER_WEIGHTS_CALLS[last], "pretrained_model_name_or_path")),
                Fact("other_weights", site),
            )
        self.follow(scope, node, name, last)

    def follow(self, scope: Scope, node: ast.Call, name: str, last: str) -> None:
        """Into a called function by name: its parameters' summaries, and nested configs built from a value."""
        if last in self.classes.fields:
            for k in node.keywords:  # ConfigClass(**value): value's keys; ConfigClass(field=value): that field
                target = last if k.arg is None else f"{last}.{k.arg}"
                for lab in scope.labels(k.value):
                    if not lab.startswith("param:") and lab != target:
                        self.aliases[lab].add(target)
        if name in ("dataclasses.replace", "replace") and node.args:
            owner = scope.type_of(node.args[0])
            for k in node.keywords if owner else ():
                for lab in scope.labels(k.value):
                    if not lab.startswith("param:"):
                        self.aliases[lab].add(f"{owner}.{k.arg}")
        if last in COMMON or len(self.defs.get(last, ())) > MAX_DEFS:
            return
        for rel, cls, fn in self.defs.get(last, ()):
            params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
            offset = 1 if cls is not None and params[:1] in (["self"], ["cls"]) else 0
            summary = self.summaries.get(fn.name, {})
            passed = {params[i + offset]: a for i, a in enumerate(node.args) if i + offset < len(params)}
            passed.update({k.arg: k.value for k in node.keywords if k.arg})
            for param, value in passed.items():
                for fact in list(summary.get(param, ())):
                    self.record(
                        scope, scope.labels(value), Fact(fact.kind, fact.site, fact.via or f"{rel}:{fn.lineno}")
                    )


def _weights_only(node: ast.Call) -> bool:
    return any(
        k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True for k in node.keywords
    )


def functions(tree: ast.Module):
    """(class name or None, function) for every function and method, nested ones too."""

    def walk(node, cls):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from walk(child, child.name)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield cls, child
                yield from walk(child, cls)
            else:
                yield from walk(child, cls)

    yield from walk(tree, None)


# -- labels to option paths -------------------------------------------------------------------------------------------
def resolved_facts(analysis: Analysis) -> dict[str, set[Fact]]:
    """Each label's facts, with what its aliases load: a value passed as ``ConfigClass(field=value)`` loads what that
    field loads, and a dict passed as ``ConfigClass(**value)`` has that class's fields as keys (nested paths too)."""
    direct = {k: set(v) for k, v in analysis.facts.items()}
    facts: dict[str, set[Fact]] = defaultdict(set, direct)
    for _ in range(4):  # aliases of aliases (a field carried through two constructors)
        changed = False
        for label, targets in analysis.aliases.items():
            for target in targets:
                # a config nested in one of its own kind (MultiConnector's connectors): one level, from the facts
                # found directly (deeper levels are the same keys again; the policy matches them by key)
                source = direct if label.split(".", 1)[0] == target.split(".", 1)[0] else facts
                for other, got in list(source.items()):
                    if other == target or other.startswith(target + "."):
                        key = label + other[len(target) :]
                        if not got <= facts[key]:
                            facts[key] |= got
                            changed = True
        if not changed:
            break
    return facts


def option_paths(analysis: Analysis) -> dict[str, set[Fact]]:
    """The facts keyed by what a launch sets: an option's dest, or a JSON option's nested path (``a.b[].c``)."""
    c = analysis.classes
    json_options = {d: n for d, names in c.options.items() for n in names if n in c.fields and n != OPTIONS}
    out: dict[str, set[Fact]] = defaultdict(set)
    for label, facts in resolved_facts(analysis).items():
        cls, _, path = label.partition(".")
        if not path or cls not in c.fields:
            continue
        head = path.split(".", 1)[0].removesuffix("[]")
        if cls in ARGS_CLASSES or cls == OPTIONS:
            if head in c.options:
                out[path] |= facts
            continue
        for dest, target in json_options.items():
            if target == cls:
                out[f"{dest}.{path}"] |= facts
    return out


NOT_SERVING = ("vllm/benchmarks/", "vllm/tests/")  # parts of the wheel `vllm serve` never runs


def read_release(root: pathlib.Path) -> dict[str, ast.Module]:
    modules = {}
    for path in sorted((root / "vllm").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(NOT_SERVING):
            continue
        try:
            modules[rel] = ast.parse(path.read_text(encoding="utf-8", errors="replace"), rel)
        except SyntaxError:
            continue
    return modules


def env_names(modules: dict[str, ast.Module]) -> list[str]:
    """The variables vllm/envs.py declares (the keys of its ``environment_variables`` table)."""
    tree = modules.get("vllm/envs.py")
    for node in ast.walk(tree) if tree is not None else ():
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == "environment_variables" and isinstance(node.value, ast.Dict):
            return sorted(k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return []


def _facts_json(facts: set[Fact]) -> list[dict]:
    rows = sorted({(f.kind, f.site, f.via, f.reviewed) for f in facts})
    return [
        {"kind": k, "site": s, **({"via": v} if v and not r else {}), **({"reviewed": v} if r else {})}
        for k, s, v, r in rows
    ]


def analyse(root: pathlib.Path) -> dict:
    """The loading facts of the release unpacked at ``root``: ``options`` (option path -> facts), ``env`` (variable
    -> facts) and ``env_names`` (the variables vllm/envs.py declares)."""
    modules = read_release(root)
    analysis = Analysis(modules)
    analysis.run()
    options: dict[str, set[Fact]] = defaultdict(set, option_paths(analysis))
    env: dict[str, set[Fact]] = defaultdict(set)
    for label, facts in resolved_facts(analysis).items():
        if label.startswith(ENV) and label[len(ENV) :].isupper():
            env[label[len(ENV) :].split(".", 1)[0].removesuffix("[]")] |= facts
    for what, facts in reviewed_facts(root).items():
        (env[what[len(ENV) :]] if what.startswith(ENV) else options[what]).update(facts)
    return {
        "options": {k: _facts_json(v) for k, v in sorted(options.items())},
        "env": {k: _facts_json(v) for k, v in sorted(env.items())},
        "env_names": env_names(modules),
        "generator": "scripts/vllm_loading.py",
    }


def main(argv: list[str] | None = None) -> None:
    json.dump(analyse(pathlib.Path((argv or sys.argv[1:])[0])), sys.stdout, indent=1)


if __name__ == "__main__":
    main()
