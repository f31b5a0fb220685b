"""Kubernetes manifests: the vLLM containers of Deployments, StatefulSets, DaemonSets, ReplicaSets, Jobs, CronJobs,
Pods, LeaderWorkerSets (leader and worker templates) and, through kserve.py, KServe InferenceServices and
ServingRuntimes, in any document of a multi-document file (and in a ``kind: List``'s items).

A container is a vLLM launch when its ``command`` + ``args`` (concatenated as Kubernetes does: ``args`` follow
``command``; without ``command`` they follow the image's ENTRYPOINT) run ``vllm serve`` or vLLM's OpenAI server,
directly or in a ``sh -c`` script, or when it runs the vllm/vllm-openai image without a ``command``."""

from __future__ import annotations

import pathlib
import re

from .containers import (
    Env,
    Hit,
    Located,
    LStr,
    k8s_expand,
    process_words,
    report_unexpanded,
    server_env,
    unescape,
)
from .entrypoints import is_vllm_image
from .found import FoundLaunch, Span, Word
from .yaml_load import Node, Source, as_int, load_all

WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # NVIDIA GPU feature discovery's label, e.g. NVIDIA-H100-80GB-HBM3


KEY = r"""(?m)(^|[{{,]\s*)["']?{}["']?[ \t]*:[ \t]*\S"""


def claims(_path: pathlib.Path | str, text: str) -> bool:
    """A Kubernetes manifest: ``apiVersion`` and ``kind`` keys at the start of a line (block style) or, quoted or
    not, after ``{`` / ``,`` (flow style, as ``kubectl get -o json`` writes it): checked on the text, without
    parsing."""
    return all(re.search(KEY.format(key), text) for key in ("apiVersion", "kind"))


def read(path: pathlib.Path | str, text: str) -> list[FoundLaunch]:
    """Every vLLM launch of a (multi-document) Kubernetes manifest. Raises YamlError for a file it cannot read."""
    src, docs = load_all(str(path), text)
    out: list[FoundLaunch] = []
    for doc in docs:
        out.extend(read_object(src, doc, docs))
    return out


def read_object(src: Source, obj: Node, docs: list[Node]) -> list[FoundLaunch]:
    kind = scalar(obj.get("kind"))
    name = scalar(obj.path("metadata", "name")) or "?"
    spec = obj.get("spec")
    if kind == "List":
        items = obj.get("items")
        return [f for it in (items.items if items and items.kind == "seq" else []) for f in read_object(src, it, docs)]
    if kind in ("InferenceService", "ServingRuntime", "ClusterServingRuntime"):
        from .kserve import read_kserve_object

        return read_kserve_object(src, obj, docs)
    label = f"{(kind or '?').lower()}/{name}"
    if kind == "Pod":
        return pod_launches(src, spec, kind="kubernetes", name=label)
    if kind in WORKLOADS:
        return pod_launches(src, spec and spec.path("template", "spec"), kind="kubernetes", name=label)
    if kind == "CronJob":
        pod = spec and spec.path("jobTemplate", "spec", "template", "spec")
        return pod_launches(src, pod, kind="kubernetes", name=label)
    if kind == "LeaderWorkerSet":
        return lws_launches(src, spec, label)
    return []


def lws_launches(src: Source, spec: Node | None, label: str) -> list[FoundLaunch]:
    """A LeaderWorkerSet (lws.sigs.k8s.io): ``leaderWorkerTemplate.size`` pods per group (the leader and size-1
    workers, one node each), the leader template defaulting to the worker template. The LWS controller gives each
    container LWS_GROUP_SIZE, LWS_LEADER_ADDRESS and LWS_WORKER_INDEX; the group size (and the leader's index 0) are
    known from the file, so ``$(LWS_GROUP_SIZE)`` resolves as Kubernetes resolves it (vLLM's
    docs/deployment/frameworks/lws.md passes it to ``multi-node-serving.sh leader --ray_cluster_size=``)."""
    lwt = spec and spec.get("leaderWorkerTemplate")
    if lwt is None:
        return []
    size_node = lwt.get("size")
    size = as_int(size_node) if size_node is not None else 1
    at = size_node.start if size_node is not None else lwt.start
    leader = lwt.path("leaderTemplate", "spec") or lwt.path("workerTemplate", "spec")
    worker = lwt.path("workerTemplate", "spec")
    extra = {"LWS_GROUP_SIZE": LStr.made(str(size or 1), at)}
    out = pod_launches(
        src,
        leader,
        kind="leaderworkerset",
        name=f"{label}/leader",
        nodes=size,
        extra={**extra, "LWS_WORKER_INDEX": LStr.made("0", at)},
    )
    if worker is not None and lwt.path("leaderTemplate", "spec") is not None:
        out += pod_launches(src, worker, kind="leaderworkerset", name=f"{label}/worker", nodes=size, extra=extra)
    return out


def pod_launches(
    src: Source,
    pod: Node | None,
    *,
    kind: str,
    name: str,
    nodes: int | None = None,
    extra: dict[str, LStr] | None = None,
) -> list[FoundLaunch]:
    """The vLLM launches of a pod spec's containers (init containers are not the server)."""
    if pod is None or pod.kind != "map":
        return []
    ctns = pod.get("containers")
    if ctns is None or ctns.kind != "seq":
        return []
    loc = Located(src)
    product = gpu_product(pod)
    out: list[FoundLaunch] = []
    for ctn in ctns.items:
        if ctn.kind == "map":
            out += container_launches(
                src, ctn, kind=kind, name=name, product=product, nodes=nodes, extra=extra, pod_problems=loc.problems
            )
    return out


def container_launches(
    src: Source,
    ctn: Node,
    *,
    kind: str,
    name: str,
    product: str | None = None,
    nodes: int | None = None,
    extra: dict[str, LStr] | None = None,
    pod_problems: list[tuple[Span, str]] | None = None,
    args_after: list[Node] | None = None,
    rename: dict[str, str] | None = None,
) -> list[FoundLaunch]:
    """A container's vLLM launches (usually none or one). ``args_after``: more args appended (a KServe model's args
    after its runtime's); ``rename``: literal substitutions (KServe's ``{{.Name}}``)."""
    loc = Located(src)
    env = read_env(src, ctn.get("env"), loc, dict(extra or {}))
    command = str_list(src, ctn.get("command"), loc, "command")
    args = (str_list(src, ctn.get("args"), loc, "args") or []) + [
        LStr.of(src, a) for a in (args_after or []) if a.kind == "scalar"
    ]
    argv = [k8s_expand(_rename(x, rename), env.values) for x in (command or []) + args]
    image = scalar(ctn.get("image"))
    if command is None:
        if not is_vllm_image(image):
            return []
        words = [Word("vllm"), Word("serve"), *(Word(a.text, loc.span(a.off(0))) for a in argv)]
        report_unexpanded(words, loc, env.values, "kubernetes")
        hits = [Hit(unescape(words), {})]
    else:
        hits = process_words(argv, env.values, loc)
    ctn_name = scalar(ctn.get("name")) or "?"
    gpus = gpu_count(ctn, loc)
    return [
        FoundLaunch(
            kind=kind,
            at=loc.node_span(ctn),
            words=hit.words,
            env=server_env(hit.env) if hit.complete else {**env.plain(), **server_env(hit.env)},
            gpu_count=gpus,
            gpu_product=product,
            nodes=nodes,
            name=f"{name}/{ctn_name}",
            problems=dedupe([*(pod_problems or []), *loc.problems, *hit.problems]),
            notes=hit.notes,
        )
        for hit in hits
    ]


def _rename(s: LStr, rename: dict[str, str] | None) -> LStr:
    if not rename or not any(k in s.text for k in rename):
        return s
    text, offs = s.text, s.offs
    for k, v in rename.items():
        while k in text:
            i = text.index(k)
            at = offs[i] if i < len(offs) else s.start
            text, offs = text[:i] + v + text[i + len(k) :], offs[:i] + [at] * len(v) + offs[i + len(k) :]
    return LStr(text, offs, s.start)


def read_env(src: Source, node: Node | None, loc: Located, values: dict[str, LStr | None]) -> Env:
    """``env:`` as Kubernetes builds it: each ``value`` expanded with the variables defined before it; a
    ``valueFrom`` variable has no value in the file (UNSET)."""
    if node is not None and node.kind == "seq":
        for item in node.items:
            n = scalar(item.get("name")) if item.kind == "map" else None
            if not n:
                continue
            v = item.get("value")
            if item.get("valueFrom") is not None:
                values[n] = None
            elif v is None or v.is_null:
                values[n] = LStr.made("", item.start)
            elif v.kind == "scalar":
                values[n] = k8s_expand(LStr.of(src, v), values)
    return Env(values)


def str_list(src: Source, node: Node | None, loc: Located, what: str) -> list[LStr] | None:
    """A ``command`` / ``args`` list of strings; a scalar where a list belongs is a located problem (Kubernetes
    refuses it), None when absent."""
    if node is None or node.is_null:
        return None
    if node.kind != "seq":
        loc.problems.append((loc.node_span(node), f"{what} must be a list of strings"))
        return None
    out = []
    for item in node.items:
        if item.kind != "scalar":
            loc.problems.append((loc.node_span(item), f"an element of {what} is not a string"))
            continue
        out.append(LStr.of(src, item))
    return out


def gpu_count(ctn: Node, loc: Located) -> int | None:
    """GPUs per pod: ``resources.limits["nvidia.com/gpu"]`` (extended resources must have requests equal to limits,
    so either says it), ``amd.com/gpu`` likewise."""
    res = ctn.get("resources")
    for part in ("limits", "requests"):
        for key in GPU_RESOURCES:
            node = res.path(part, key) if res is not None else None
            if node is None:
                continue
            n = as_int(node)
            if n is None:
                loc.problems.append((loc.node_span(node), f"{part}.{key} {node.text!r} is not a whole number of GPUs"))
            return n
    return None


def gpu_product(pod: Node) -> str | None:
    """The ``nvidia.com/gpu.product`` label (NVIDIA GPU feature discovery's, e.g. NVIDIA-H100-80GB-HBM3) a pod is
    pinned to by a ``nodeSelector`` or a required node affinity with one value, as written: resolve.py's
    ``resolve_hardware`` reads it (the catalogue GPU it names; a MIG slice or a shared GPU refused), unless --gpu is
    given."""
    node = pod.path("nodeSelector", GPU_PRODUCT_LABEL)
    if node is None:
        terms = pod.path(
            "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms"
        )
        node = affinity_product(terms)
    return node.text.strip() if node is not None and node.kind == "scalar" else None


def affinity_product(terms: Node | None) -> Node | None:
    values: list[Node] = []
    for term in terms.items if terms is not None and terms.kind == "seq" else []:
        exprs = term.get("matchExpressions") if term.kind == "map" else None
        for ex in exprs.items if exprs is not None and exprs.kind == "seq" else []:
            if scalar(ex.get("key")) == GPU_PRODUCT_LABEL and scalar(ex.get("operator")) == "In":
                vals = ex.get("values")
                values += [v for v in (vals.items if vals is not None and vals.kind == "seq" else [])]
    return values[0] if len({v.text for v in values}) == 1 else None


def scalar(node: Node | None) -> str | None:
    return node.text if node is not None and node.kind == "scalar" and not node.is_null else None


def dedupe(problems: list[tuple[Span, str]]) -> list[tuple[Span, str]]:
    seen: set[tuple[Span, str]] = set()
    out = []
    for p in problems:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out
