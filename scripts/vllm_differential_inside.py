"""Runs INSIDE the catalogue generator's throw-away environment (CPU torch, one vLLM release installed with
``--no-deps``, PYTHONPATH pointing at it): judges launches with vLLM's own code and prints one verdict per launch
as JSON lines. Started by scripts/vllm_differential.py; never imported by the service.

    python vllm_differential_inside.py CASES.jsonl GPU.json    # every case of the file on one GPU model
                                                              # (each case names its GPU count)

For each case: the ``vllm serve`` argv is parsed by the release's own parser (FlexibleArgumentParser + the serve
subcommand, built as scripts/vllm_catalogue_inside.py builds it), the serve-level checks run
(``validate_parsed_serve_args``), then ``EngineArgs.from_cli_args(ns).create_engine_config()`` builds the whole
``VllmConfig`` against the case's ``config.json`` in a temporary directory (no weights, no tokenizer files).

What no CPU can provide is stubbed, and nothing else:
- the platform is vLLM's own ``CudaPlatformBase`` with the device queries answered from GPU.json (name, compute
  capability, memory, count), so every check vLLM makes against the GPU runs as on that GPU;
- the release's compiled extensions (``*.so``) and the ``torch.ops`` namespaces they register are mocks;
- a dependency the release *requires* (its wheel's Requires-Dist) but this environment lacks is a mock when vLLM's
  code imports it; an optional one (``ray``, …) stays absent, as in a default ``pip install vllm``;
- the model registry inspects a model class in this process instead of a subprocess.
A launch that fails for a reason of this environment (an import, a mock) is reported as ``harness`` with its
traceback's last line, never as vLLM's verdict.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import io
import json
import logging
import os
import pathlib
import re
import signal
import sys
import tempfile
import traceback
from unittest.mock import MagicMock

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import vllm_catalogue_inside as inside  # noqa: E402

RELEASE = pathlib.Path(os.environ["PYTHONPATH"].split(os.pathsep)[0])
# distribution name -> import name, where the two differ by more than case and separators
IMPORT_ALIASES = {"pyzmq": "zmq", "pillow": "PIL", "opencv_python_headless": "cv2", "protobuf": "google"}
CASE_SECONDS = 60
# refusals that depend on the machine vLLM's code runs on, not the launch: --swap-space against this host's RAM
# (vllm 0.10.2 vllm/config/cache.py:195-212: swap space above 70 % of psutil total memory)
# or that need the CUDA runtime this machine lacks (vllm 0.33.0 vllm/distributed/device_communicators/cuda_wrapper.py:127)
# and the tokenizer files a real checkpoint ships, which the case's directory (config.json only) lacks: options that
# load the tokenizer at config time (structured outputs, reasoning parsers) fail here and not on a node
HOST_DEPENDENT = (
    "total CPU memory is allocated for the swap space",
    "libcudart is not loaded",
    "Couldn't instantiate the backend tokenizer",
)


class OpStub:
    """A kernel of a compiled extension: never run here; probed at import for what the GPU supports (``False``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args, **kwargs):
        return False

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return self


class NamedMock(MagicMock):
    """A mock module that keeps its name (so attribute calls work) and that pydantic can build a schema for."""

    def __get_pydantic_core_schema__(self, source_type, handler):
        return inside.core_schema.any_schema()


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def required_imports() -> set[str]:
    """Top-level import names of the release's unconditional requirements (its wheel's METADATA)."""
    meta = next(RELEASE.glob("vllm-*.dist-info/METADATA"))
    names = set()
    for line in meta.read_text().splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            dist = _norm(re.split(r"[ ;<>=!~\[(]", line.split(":", 1)[1].strip())[0])
            names.add(IMPORT_ALIASES.get(dist, dist))
    return names


def _is_required(top: str, required: set[str]) -> bool:
    t = _norm(top)
    return any(t == d or f"_{t}_" in f"_{d}_" or t.replace("_", "") == d.replace("_", "") for d in required)


def _imported_by_vllm() -> bool:
    f = sys._getframe(2)
    while f is not None and (f.f_code.co_filename.startswith("<frozen") or "importlib" in f.f_code.co_filename):
        f = f.f_back
    return f is not None and str(f.f_globals.get("__name__", "")).startswith("vllm")


# A mocked required dependency answers as it does on a node where it is installed and idle: Ray with no cluster
# started in the process (a truthy mock made vllm 0.13.0 config/parallel.py:577-588 pick the ray executor)
MOCK_ANSWERS: dict[str, dict[str, object]] = {
    "ray": {"is_initialized": False},
    "ray.util": {"get_current_placement_group": None},
}


class MockFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``front``: placed first, answers the release's compiled extensions. Otherwise placed last: answers a
    required dependency missing from this environment, when vLLM's code imports it."""

    def __init__(self, front: bool, compiled: set[str], required: set[str]) -> None:
        self.front, self.compiled, self.required = front, compiled, required

    def find_spec(self, name, path, target=None):
        if name in self.compiled:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        top = name.split(".")[0]
        if self.front or top == "vllm" or top in sys.stdlib_module_names:
            return None
        if "." in name and not isinstance(sys.modules.get(top), MagicMock):
            return None
        if not _is_required(top, self.required) or not _imported_by_vllm():
            return None  # other libraries probe their optional imports (Transformers: torchvision's version)
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = NamedMock(name=spec.name)
        module.__spec__, module.__path__ = spec, []
        for attr, value in MOCK_ANSWERS.get(spec.name, {}).items():
            setattr(module, attr, MagicMock(return_value=value))
        inside.MOCKED.append(spec.name)
        return module

    def exec_module(self, module):
        pass


def _mock_extension_ops() -> None:
    """``torch.ops._C.x`` and friends: registered by the compiled extensions this CPU cannot load."""
    import torch
    import torch._ops
    import torch.library

    real_getattr = torch._ops._OpNamespace.__getattr__

    def getattr_(self, op):
        try:
            return real_getattr(self, op)
        except AttributeError:
            if op.startswith("__") or not self.name.startswith("_"):
                raise
            return OpStub(f"torch.ops.{self.name}.{op}")

    torch._ops._OpNamespace.__getattr__ = getattr_
    real_fake = torch.library.register_fake

    def register_fake(op, fn=None, /, *a, **k):
        if isinstance(op, str) and op.startswith("_"):
            return (lambda f: f) if fn is None else fn
        return real_fake(op, fn, *a, **k)

    torch.library.register_fake = register_fake
    if hasattr(torch.library, "impl_abstract"):
        torch.library.impl_abstract = register_fake


def install_stubs() -> None:
    compiled = {
        ".".join((*p.relative_to(RELEASE).parts[:-1], p.name.split(".")[0])) for p in RELEASE.glob("vllm/**/*.so")
    }
    required = required_imports()
    sys.meta_path.insert(0, MockFinder(True, compiled, required))
    sys.meta_path.append(MockFinder(False, compiled, required))
    _mock_extension_ops()


def stub_platform(gpu: dict):
    """vLLM's CUDA platform with the device queries answered for ``gpu``, installed as the current platform."""
    cuda = inside.auto_import("vllm.platforms.cuda")
    interface = inside.auto_import("vllm.platforms.interface")
    major, minor = (int(x) for x in gpu["compute_capability"].split("."))
    cap = interface.DeviceCapability(major, minor)

    class GpuStub(cuda.CudaPlatformBase):
        @classmethod
        def get_device_capability(cls, device_id=0):
            return cap

        @classmethod
        def has_device_capability(cls, capability, device_id=0):
            want = capability if isinstance(capability, int) else capability[0] * 10 + capability[1]
            return cap.to_int() >= want

        @classmethod
        def is_device_capability(cls, capability, device_id=0):
            want = capability if isinstance(capability, int) else capability[0] * 10 + capability[1]
            return cap.to_int() == want

        @classmethod
        def get_device_name(cls, device_id=0):
            return gpu["name"]

        @classmethod
        def get_device_total_memory(cls, device_id=0):
            return int(gpu["memory_bytes"])

        @classmethod
        def is_fully_connected(cls, physical_device_ids):
            return bool(gpu.get("nvlink"))

        @classmethod
        def device_count(cls):
            return int(gpu["count"])  # set per case by main()

    import vllm.platforms as platforms

    platforms._current_platform = GpuStub()
    _stub_torch_cuda(gpu, major, minor)
    for mod in ("vllm.utils.torch_utils", "vllm.utils", "vllm.platforms.cuda"):
        with contextlib.suppress(ImportError):
            module = importlib.import_module(mod)
            for name in ("cuda_device_count_stateless", "_cuda_device_count_stateless"):
                if hasattr(module, name):
                    setattr(module, name, lambda *a, **k: int(gpu["count"]))
    registry = inside.auto_import("vllm.model_executor.models.registry")
    registry._run_in_subprocess = lambda fn: fn()  # the subprocess would not carry these stubs


def _stub_torch_cuda(gpu: dict, major: int, minor: int) -> None:
    """torch.cuda's device queries answered for ``gpu``: some config-time paths ask torch directly rather than the
    platform (vllm 0.10.2 vllm/vllm_flash_attn/flash_attn_interface.py:43, reached from
    platforms/cuda.py:554 is_kv_cache_dtype_supported), which on this CPU-only machine would raise "Found no NVIDIA
    driver" where a node answers with its GPU."""
    import types

    import torch

    props = types.SimpleNamespace(
        name=gpu["name"], major=major, minor=minor, total_memory=int(gpu["memory_bytes"]), multi_processor_count=132
    )
    torch.cuda.get_device_capability = lambda device=None: (major, minor)
    torch.cuda.get_device_name = lambda device=None: gpu["name"]
    torch.cuda.get_device_properties = lambda device=None: props


def serve_parser():
    """``vllm serve``'s parser as the ``vllm`` command builds it: the top-level FlexibleArgumentParser with the
    serve subcommand holding the release's serve options."""
    parser = inside.build_serve_parser()
    fap = None
    for mod in ("vllm.utils.argparse_utils", "vllm.utils"):
        with contextlib.suppress(ImportError, AttributeError):
            fap = inside.auto_import(mod, "FlexibleArgumentParser")
            break
    top = fap(prog="vllm")
    sub = top.add_subparsers(dest="subparser").add_parser("serve")
    for action in parser._actions:
        if action.option_strings and "--help" in action.option_strings:
            continue
        sub._add_action(action)
    return top


def _first_line(e: BaseException) -> str:
    errors = getattr(e, "errors", None)
    if callable(errors):  # pydantic: the field and what was wrong with it
        with contextlib.suppress(Exception):
            first = errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ()))
            return (f"{where}: " if where else "") + str(first.get("msg", ""))[:400]
    text = str(e).strip()
    for line in text.splitlines():  # pydantic: the line after "N validation error(s) for X" says what
        if line.strip() and "validation error" not in line and not line.strip().startswith("For further"):
            return line.strip()[:400]
    return (type(e).__name__ + ": " + text)[:400]


def _environmental(e: BaseException) -> bool:
    """An import this environment lacks, a mock or kernel stub in the way, or the registry failing to import a model
    class (the same imports): the environment's failure, not vLLM's verdict."""
    tb = "".join(traceback.format_exception(e))
    if any(fragment in str(e) for fragment in HOST_DEPENDENT):
        return True
    return isinstance(e, ImportError) or "Mock" in tb or "OpStub" in tb or "failed to be inspected" in tb


def _needs_repository_code(e: BaseException, model_dir: str) -> bool:
    """The registry's Transformers fallback loads auto_map's AutoModel class from the repository (vllm 0.13.0
    vllm/model_executor/models/registry.py:856-878): the case's directory holds config.json only, a node the whole
    checkpoint, so "not supported" for a config with such an entry is this environment's failure."""
    if "are not supported for now" not in str(e):
        return False
    try:
        auto_map = json.loads((pathlib.Path(model_dir) / "config.json").read_text()).get("auto_map") or {}
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(auto_map, dict) and any(str(k).startswith("AutoModel") for k in auto_map)


def judge(case: dict, top, model_dir: str) -> dict:
    argv = [a if a != "{MODEL}" else model_dir for a in case["argv"]]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = top.parse_args(["serve", *argv[2:]])
    except SystemExit:
        text = err.getvalue()
        said = text[text.find("error:") :] if "error:" in text else text  # argparse: "prog: error: ..."
        return {"verdict": "reject", "stage": "parser", "message": " ".join(said.split())[:400]}
    if (
        getattr(ns, "model_tag", None) is not None
    ):  # ServeSubcommand.cmd (vllm 0.33.0 vllm/entrypoints/cli/serve.py:56-57)
        ns.model = ns.model_tag
    try:
        validate = None
        for mod in (  # where the release keeps it (0.32: entrypoints/launchers)
            "vllm.entrypoints.common.cli_args",
            "vllm.entrypoints.launchers.cli_args",
            "vllm.entrypoints.openai.cli_args",
        ):
            with contextlib.suppress(ImportError, AttributeError):
                validate = inside.auto_import(mod, "validate_parsed_serve_args")
                break
        if validate is not None:
            validate(ns)
        engine_args = inside.auto_import("vllm.engine.arg_utils", "EngineArgs")
        # as `vllm serve` builds it: the OpenAI server's usage context picks the scheduler defaults (vllm 0.10.2
        # vllm/entrypoints/openai/api_server.py:192, 205; arg_utils.py:1740-1743 caps max_num_seqs by it)
        usage = inside.auto_import("vllm.usage.usage_lib", "UsageContext").OPENAI_API_SERVER
        config = engine_args.from_cli_args(ns).create_engine_config(usage_context=usage)
    except TimeoutError:
        raise  # the case's alarm: no verdict
    except Exception as e:  # noqa: BLE001 - vLLM would not start: its refusal, unless this environment caused it
        if os.environ.get("DIFF_DEBUG"):
            traceback.print_exc()
        if _environmental(e) or _needs_repository_code(e, model_dir):
            return {"verdict": "harness", "message": f"{type(e).__name__}: {_first_line(e)}"}
        return {"verdict": "reject", "stage": "config", "type": type(e).__name__, "message": _first_line(e)}
    return {
        "verdict": "accept",
        "max_model_len": config.model_config.max_model_len,
        "world_size": config.parallel_config.world_size,
        "distributed_executor_backend": str(config.parallel_config.distributed_executor_backend),
    }


def _timeout(signum, frame):
    raise TimeoutError(f"no verdict within {CASE_SECONDS} s")


def judge_isolated(case: dict, top, model_dir: str) -> dict:
    """``judge`` in a forked child: vLLM's config code keeps process state (os.environ["VLLM_USE_V1"] in 0.9/0.10,
    config objects mutated in place), so no case may see another's. The child has the parent's imports, warm."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: judge, write one JSON line, leave without running the parent's cleanup
        os.close(read_end)
        signal.signal(signal.SIGALRM, _timeout)
        signal.alarm(CASE_SECONDS)
        try:
            out = judge(case, top, model_dir)
        except BaseException as e:  # noqa: BLE001 - the timeout, or anything that escaped judge
            out = {"verdict": "harness", "message": f"{type(e).__name__}: {e}"[:400]}
        os.write(write_end, json.dumps(out).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return {"verdict": "harness", "message": f"the judging process died (status {status})"}
    return json.loads(data)


def main(cases_path: str, gpu_path: str) -> int:
    logging.disable(logging.CRITICAL)
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_LOGGING_LEVEL="CRITICAL")
    gpu = json.loads(pathlib.Path(gpu_path).read_text())
    install_stubs()
    stub_platform(gpu)
    top = serve_parser()
    with tempfile.TemporaryDirectory() as tmp:
        for line in pathlib.Path(cases_path).read_text().splitlines():
            case = json.loads(line)
            model_dir = os.path.join(tmp, case["id"])
            os.makedirs(model_dir, exist_ok=True)
            for name, content in case["files"].items():  # config.json, hf_quant_config.json
                pathlib.Path(model_dir, name).write_text(json.dumps(content))
            gpu["count"] = case["count"]
            out = judge_isolated(case, top, model_dir)
            print(json.dumps({"id": case["id"], **out}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
