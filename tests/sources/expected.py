"""tests/fixtures/deploy/EXPECTED.json: what each deploy file holds (the readers' launches) and the verdict the
finished ``preflight check`` must give for each, computed by building the launch request by hand (argv → engine
arguments by the plain ``--flag value`` rule, a ``--config`` file's keys merged under them, the model from
tests/fixtures/models, the hardware from the file or, where the file says nothing, the GPU and count named under
``hardware.assumed``) and running ``service.domain.validate``. ``rule``, ``line`` and ``col``: the first error (else
warning) and the word it is placed at; a launch the reader could not read is ``invalid`` / ``source_unreadable`` at
its first problem, as ``preflight check`` reports it.

``python -m tests.sources.expected`` rewrites the file; tests/sources/test_corpus.py checks it is current and
tests/sources/test_check_corpus.py that ``preflight check`` gives what it says."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shlex
import sys
from collections.abc import Iterator

import yaml

from service.domain.errors import DomainError
from service.domain.request import LaunchRequest
from service.domain.validate import validate
from service.sources.command import read_command
from service.sources.found import FoundLaunch, Span
from service.sources.read import read_launches
from tests.support import MODELS, request

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "tests" / "fixtures" / "deploy"
EXPECTED = DEPLOY / "EXPECTED.json"
UNREADABLE = "source_unreadable"  # the rule preflight check reports a FoundLaunch's problems under

# What the file does not say: the GPU (and count) the end-to-end check is to be given on the command line.
ASSUMED = {
    "compose-docker-gpu-docs.yaml": {"gpu": "l40s-48gb"},
    "compose-entrypoint-shell.yaml": {"gpu": "a100-sxm4-80gb"},
    "compose-interpolation.yaml": {"gpu": "l40s-48gb"},
    "compose-unknown-flag.yaml": {"gpu": "a100-sxm4-80gb"},
    "helm-01-minimal.yaml": {"gpu": "l4-24gb"},
    "helm-02-basic-config.yaml": {"gpu": "a100-sxm4-40gb"},
    "helm-04-multiple-models.yaml": {"gpu": "l4-24gb"},
    "helm-05-lmcache.yaml": {"gpu": "a100-sxm4-80gb"},
    "helm-25-v100-tp2.yaml": {"gpu": "v100-16gb"},
    "k8s-deployment-cpu-docs.yaml": {"gpu": "l4-24gb", "count": 1},
    "k8s-job-valuefrom-in-args.yaml": {"gpu": "l4-24gb"},
    "kserve-servingruntime-alone.yaml": {"gpu": "h100-sxm-80gb", "count": 1},
    # the files of the one launch in every form (tests/cli/test_check_sources.py): on 2 x H100 SXM
    "cmd-llama.txt": {"gpu": "h100-sxm-80gb", "count": 2},
    "compose-llama-same-launch.yaml": {"gpu": "h100-sxm-80gb"},
    "docker-vllm-openai.Dockerfile": {"gpu": "h100-sxm-80gb", "count": 2},
    "sh-bad-tp.sh": {"gpu": "h100-sxm-80gb", "count": 2},
    "sh-serve-llama.sh": {"gpu": "h100-sxm-80gb", "count": 2},
    "vllm-config-llama.yaml": {"gpu": "h100-sxm-80gb", "count": 2},
}
# A model the argv names by its local path: the fixture the file's storageUri names.
MODEL_PATHS = {"kserve-servingruntime-vllm.yaml": "Qwen__Qwen3-8B"}
# A model whose fixture is its base model's config.json (the same architecture and sizes).
SAME_CONFIG = {"meta-llama/Meta-Llama-3.1-405B-Instruct": "meta-llama__Meta-Llama-3.1-405B"}


# Verdicts worth a second look, said next to them.
NOTES = {
    "lws-llama-405b.yaml": (
        "vLLM's own LWS example (docs/deployment/frameworks/lws.md) gives no --distributed-executor-backend: vLLM "
        "0.33.0 refuses it at start-up, vllm/config/parallel.py:1066-1076 (CUDA, one --nnodes, device_count() 8 < "
        "world size 16 raises before the Ray choice at :1084-1093, which is reached only when the world fits the "
        "node); with --distributed-executor-backend ray the rule accepts the 2 nodes x 8 GPUs"
    ),
}


@contextlib.contextmanager
def at_root() -> Iterator[None]:
    """Files are named relative to the repository (tests/fixtures/deploy/…), as a user names them from its root."""
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(cwd)


def rel(path: pathlib.Path) -> pathlib.Path:
    return path.relative_to(ROOT)


def read(path: pathlib.Path) -> list[FoundLaunch]:
    """The launches of a corpus file, read by service/sources/read.py's dispatch (a ``cmd-*.txt`` file holds a
    command line, checked as ``preflight check -- WORDS``)."""
    if path.name.startswith("cmd-"):
        return [read_command(shlex.split(path.read_text()))]
    with at_root():
        return read_launches(rel(path))


def split_argv(argv: list[str]) -> tuple[str | None, int | None, dict[str, object], dict[str, int]]:
    """``vllm serve [MODEL] --flag [value] …`` (or ``python … -m vllm.entrypoints.openai.api_server --flag …``) as
    (model, the model word's index, engine_args, the index of the word that set each): ``--k=v`` and ``--k v`` give
    a value, a flag followed by another option or nothing is true; ``--model`` names the model."""
    start = 2 if argv[0] == "vllm" else argv.index("-m") + 2
    model, model_at = None, None
    if start < len(argv) and not argv[start].startswith("-") and argv[0] == "vllm":
        model, model_at, start = argv[start], start, start + 1
    args: dict[str, object] = {}
    where: dict[str, int] = {}
    i = start
    while i < len(argv):
        key, eq, val = argv[i].partition("=")
        where[key] = i
        if eq:
            args[key], i = val, i + 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            args[key], i = argv[i + 1], i + 2
        else:
            args[key], i = True, i + 1
    if model is None and "--model" in args:
        model, model_at = str(args.pop("--model")), where["--model"] + (0 if "=" in argv[where["--model"]] else 1)
    return model, model_at, args, where


def config_keys(f: FoundLaunch, args: dict[str, object]) -> dict[str, Span]:
    """A ``--config FILE``'s keys merged under the command line (``model:`` names the model); where each is."""
    path = args.pop("--config", None)
    if not isinstance(path, str):
        return {}
    from service.sources.vllm_config import key_spans

    text = (ROOT / path).read_text()
    for key, value in yaml.safe_load(text).items():
        args.setdefault(f"--{key}", value)
    return key_spans(text, path)


def fixture_of(file: str, model: str | None) -> str | None:
    if file in MODEL_PATHS:
        return MODEL_PATHS[file]
    if model in SAME_CONFIG:
        return SAME_CONFIG[model]
    if model and (MODELS / model.replace("/", "__")).is_dir():
        return model.replace("/", "__")
    return None


def catalogue_id(label: str | None) -> str | None:
    """The catalogue GPU a GPU-feature-discovery ``nvidia.com/gpu.product`` label names (nvidia-smi's name, blanks
    as dashes)."""
    from service.domain.gpus import lookup

    gpu = lookup(label) if label else None
    return gpu.id if gpu is not None else label


class Places:
    """Where ``preflight check`` places a finding: the option word a field names (``engine_args.X``; a ``--config``
    key at the key), the model word (``model.*``), else the launch."""

    def __init__(self, f: FoundLaunch, model_at: int | None, keys: dict[str, Span]) -> None:
        self.f, self.model_at, self.keys = f, model_at, keys

    def of(self, field: str | None) -> Span:
        head, _, rest = (field or "").partition(".")
        name = rest.split(".", 1)[0]
        if head == "engine_args":
            for w in self.f.words:
                opt = w.text.split("=", 1)[0].lstrip("-").replace("-", "_")
                if w.at is not None and w.text.startswith("--") and opt in (name, f"no_{name}"):
                    return w.at
            for key, at in self.keys.items():
                if key.replace("-", "_") == name:
                    return at
        if head == "model":
            if self.model_at is not None and self.f.words[self.model_at].at is not None:
                return self.f.words[self.model_at].at
            if "model" in self.keys:
                return self.keys["model"]
        return self.f.at


def expect(path: pathlib.Path) -> list[dict]:
    out = []
    for f in read(path):
        model, model_at, args, _ = split_argv(f.argv)
        keys = config_keys(f, args)
        if model is None and "--model" in args:
            model = str(args.pop("--model"))
        fixture = fixture_of(path.name, model)
        assumed = ASSUMED.get(path.name, {})
        # given on the command line, the assumed GPU and count hold for every launch of the file (they win over what
        # the file says, as --gpu / --gpus do)
        gpu = assumed.get("gpu") or catalogue_id(f.gpu_product)
        count = assumed.get("count") or f.gpu_count
        entry: dict = {
            "name": f.name,
            "kind": f.kind,
            "at": str(f.at),
            "argv": f.argv,
            "spans": [str(w.at) if w.at else None for w in f.words],
            "env": f.env,
            "gpu_count": f.gpu_count,
            "gpu_product": f.gpu_product,
            "nodes": f.nodes,
            "problems": [[str(s), m] for s, m in f.problems],
            "model_fixture": fixture,
            "model": model,
            "hardware": {"gpu": gpu, "count": count, "nodes": f.nodes or 1, "assumed": sorted(assumed)},
        }
        entry.update(verdict(f, fixture, gpu, count, args, Places(f, model_at, keys)))
        if path.name in NOTES:
            entry["note"] = NOTES[path.name]
        out.append(entry)
    return out


def placed(verdict: str | None, rule: str | None, at: Span | None) -> dict:
    return {"verdict": verdict, "rule": rule, "line": at.line if at else None, "col": at.col if at else None}


def refused_argv(f: FoundLaunch) -> dict | None:
    """An argv the release's parser refuses (an unknown option, a value of the wrong type): ``preflight check``
    reports it as ``argv_unreadable`` at the word at fault (service/domain/launch_argv.py, tested on its own in
    tests/domain/test_launch_argv.py), before any rule runs."""
    from service.domain.launch_argv import LaunchArgvError, read_launch_argv
    from service.domain.versions import newest_line

    try:
        read_launch_argv(f.argv, newest_line(), lambda path: (ROOT / path).read_text())
    except LaunchArgvError as exc:
        word = f.words[exc.index].at if exc.index is not None else None
        return placed("reject", "argv_unreadable", word or f.at)
    return None


def verdict(f: FoundLaunch, fixture: str | None, gpu: str | None, count: int | None, args: dict, at: Places) -> dict:
    if f.problems:
        return placed("invalid", UNREADABLE, f.problems[0][0])
    refused = refused_argv(f)
    if refused is not None:
        return refused
    if fixture is None:  # no --models for it, and it is neither a directory here nor a Hub id (no network in tests)
        return placed("invalid", "model_unresolved", at.of("model"))
    if gpu is None or count is None:
        return placed("invalid", "hardware_unresolved", f.at)
    req = request(fixture, gpu=gpu, count=count, nodes=f.nodes or 1, **args)
    req["env"] = {k: v for k, v in f.env.items() if k.startswith("VLLM_")}
    try:
        result = validate(LaunchRequest.model_validate(req))
    except DomainError as exc:
        return placed("reject", exc.rule, at.of(exc.field))
    errors = [x for x in result.findings if x.severity.value == "error"]
    warnings = [x for x in result.findings if x.severity.value == "warning"]
    first = errors[0] if errors else warnings[0] if warnings else None
    return placed(result.verdict, first.rule if first else None, at.of(first.field) if first else None)


def corpus() -> list[pathlib.Path]:
    """Every deploy file of the corpus (all kinds)."""
    return sorted(p for p in DEPLOY.iterdir() if p.is_file() and p.name != EXPECTED.name)


def build() -> dict:
    return {p.name: expect(p) for p in corpus()}


if __name__ == "__main__":
    EXPECTED.write_text(json.dumps(build(), indent=1) + "\n")
    sys.exit(0)
