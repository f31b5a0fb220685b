"""tests/fixtures/deploy/EXPECTED.json: what each deploy file holds (the readers' launches) and the verdict the
finished ``preflight check`` must give for each, computed by building the launch request by hand (argv → engine
arguments by the plain ``--flag value`` rule, the model from tests/fixtures/models, the hardware from the file or,
where the file says nothing, the GPU named under ``assumed``) and running ``service.domain.validate``.

``python -m tests.sources.expected`` rewrites the file; tests/sources/test_corpus.py checks it is current."""

from __future__ import annotations

import json
import pathlib
import sys

from service.domain.errors import DomainError
from service.domain.request import LaunchRequest
from service.domain.validate import validate
from service.sources.compose import read_compose
from service.sources.found import FoundLaunch
from service.sources.helm import read_helm_values
from service.sources.kube import read_kubernetes
from tests.support import MODELS, request

DEPLOY = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "deploy"
EXPECTED = DEPLOY / "EXPECTED.json"

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
}
# A model the argv names by its local path: the fixture the file's storageUri names.
MODEL_PATHS = {"kserve-servingruntime-vllm.yaml": "Qwen__Qwen3-8B"}
# A model whose fixture is its base model's config.json (the same architecture and sizes).
SAME_CONFIG = {"meta-llama/Meta-Llama-3.1-405B-Instruct": "meta-llama__Meta-Llama-3.1-405B"}


# Verdicts worth a second look, said next to them.
NOTES = {
    "lws-llama-405b.yaml": (
        "vLLM's own LWS example: Preflight's world_size_exceeds_gpus asks for --distributed-executor-backend ray, "
        "but vLLM picks ray itself when the world size exceeds the node's GPUs and a Ray cluster is up "
        "(multi-node-serving.sh starts one): a false reject to review in the rule, not in the reader"
    ),
}


def read(path: pathlib.Path) -> list[FoundLaunch]:
    text = path.read_text()
    rel = f"tests/fixtures/deploy/{path.name}"
    if path.name.startswith("compose-"):
        return read_compose(rel, text)
    if path.name.startswith("helm-"):
        return read_helm_values(rel, text)
    return read_kubernetes(rel, text)


def split_argv(argv: list[str]) -> tuple[str | None, dict[str, object]]:
    """``vllm serve [MODEL] --flag [value] …`` as (model, engine_args): ``--k=v`` and ``--k v`` give a value, a flag
    followed by another option or nothing is true; ``--model`` names the model."""
    words = argv[2:]
    model = None
    if words and not words[0].startswith("-"):
        model, words = words[0], words[1:]
    args: dict[str, object] = {}
    i = 0
    while i < len(words):
        w = words[i]
        key, eq, val = w.partition("=")
        if eq:
            args[key] = val
            i += 1
        elif i + 1 < len(words) and not words[i + 1].startswith("--"):
            args[key] = words[i + 1]
            i += 2
        else:
            args[key] = True
            i += 1
    if model is None and "--model" in args:
        model = str(args.pop("--model"))
    return model, args


def fixture_of(file: str, model: str | None) -> str | None:
    if file in MODEL_PATHS:
        return MODEL_PATHS[file]
    if model in SAME_CONFIG:
        return SAME_CONFIG[model]
    if model and (MODELS / model.replace("/", "__")).is_dir():
        return model.replace("/", "__")
    return None


def field_line(f: FoundLaunch, field: str | None) -> int:
    """The line of the option a finding's field names (``engine_args.tensor_parallel_size``), else the launch's."""
    name = (field or "").removeprefix("engine_args.")
    for w in f.words:
        opt = w.text.split("=", 1)[0].lstrip("-").replace("-", "_")
        if w.at is not None and w.text.startswith("--") and opt in (name, f"no_{name}"):
            return w.at.line
    return f.at.line


def expect(path: pathlib.Path) -> list[dict]:
    out = []
    for f in read(path):
        model, args = split_argv(f.argv)
        fixture = fixture_of(path.name, model)
        assumed = ASSUMED.get(path.name, {})
        gpu = f.gpu_product or assumed.get("gpu")
        count = f.gpu_count or assumed.get("count") or 1
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
            "hardware": {"gpu": gpu, "count": count, "nodes": f.nodes or 1, "assumed": sorted(assumed)},
        }
        entry.update(verdict(f, fixture, gpu, count, args))
        if path.name in NOTES:
            entry["note"] = NOTES[path.name]
        out.append(entry)
    return out


def verdict(f: FoundLaunch, fixture: str | None, gpu: str | None, count: int, args: dict) -> dict:
    if f.problems:
        return {"verdict": "invalid", "rule": "unreadable", "line": f.problems[0][0].line}
    if fixture is None or gpu is None:
        return {"verdict": None, "rule": None, "line": None}
    req = request(fixture, gpu=gpu, count=count, nodes=f.nodes or 1, **args)
    req["env"] = dict(f.env)
    try:
        result = validate(LaunchRequest.model_validate(req))
    except DomainError as exc:
        return {"verdict": "invalid", "rule": exc.rule, "line": field_line(f, exc.field)}
    errors = [x for x in result.findings if x.severity.value == "error"]
    warnings = [x for x in result.findings if x.severity.value == "warning"]
    first = errors[0] if errors else warnings[0] if warnings else None
    return {
        "verdict": result.verdict,
        "rule": first.rule if first else None,
        "line": field_line(f, first.field) if first else None,
    }


def build() -> dict:
    return {p.name: expect(p) for p in sorted(DEPLOY.glob("*.yaml"))}


if __name__ == "__main__":
    EXPECTED.write_text(json.dumps(build(), indent=1) + "\n")
    sys.exit(0)
