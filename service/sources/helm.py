"""vLLM production-stack Helm values (github.com/vllm-project/production-stack, chart ``helm/``): each
``servingEngineSpec.modelSpec[]`` entry is a Deployment whose container runs ``vllm serve``, its argv written by
helm/templates/deployment-vllm-multi.yaml from the entry's keys. This reproduces that template (production-stack at
commit a6c01db0; the line numbers below are that file's) for the options it writes, so a finding points at the
values key it came from: a word the template makes up (``--max-model-len``) is placed at its values key, a value at
the values scalar; ``vllm``, ``serve``, ``--host 0.0.0.0`` and ``--port`` have no place.

Helm reads values with sigs.k8s.io/yaml, which goes through JSON: every number is a float64, and ``quote`` prints it
with Go's ``%v`` (sprig's ``strval``), so ``maxModelLen: 1000000`` reaches vLLM as ``"1e+06"``. That is reproduced
too: it is what the container gets.

Entries with ``enabled: false`` (line 3) or ``raySpec.enabled`` (line 4: rendered by ray-cluster.yaml instead, a
KubeRay cluster this does not read) are no launch here; nor is anything when ``servingEngineSpec.enableEngine`` is
false (line 1; values.yaml's default is true)."""

from __future__ import annotations

import json
import pathlib
import re
from decimal import Decimal

from .containers import Located, server_env
from .found import FoundLaunch, Span, Word
from .kube import affinity_product, dedupe, gpu_count, read_env, scalar
from .yaml_load import Node, Source, as_int, load_all, scalar_type

DEFAULT_PORT = "8000"  # helm/templates/_helpers.tpl:4-6, chart.container-port


def claims(_path: pathlib.Path | str, text: str) -> bool:
    """production-stack values: a top-level ``servingEngineSpec:`` (checked on the text, without parsing)."""
    return bool(re.search(r"(?m)^servingEngineSpec:[ \t]*(?:#.*)?$", text))


def read(path: pathlib.Path | str, text: str) -> list[FoundLaunch]:
    """The ``vllm serve`` launch of each enabled modelSpec entry. Raises YamlError for a file it cannot read."""
    src, docs = load_all(str(path), text)
    if not docs:
        return []
    ses = docs[0].get("servingEngineSpec")
    if ses is None or ses.kind != "map" or _falsy(ses.get("enableEngine"), default=True):
        return []
    specs = ses.get("modelSpec")
    out: list[FoundLaunch] = []
    for ms in specs.items if specs is not None and specs.kind == "seq" else []:
        if ms.kind != "map":
            continue
        enabled = ms.get("enabled")
        if enabled is not None and scalar_type(enabled) == "bool" and enabled.text.lower() == "false":
            continue  # line 3: ``ne $modelSpec.enabled false``
        if _truthy(ms.path("raySpec", "enabled")):
            continue
        out.append(model_launch(src, docs[0], ses, ms))
    return out


def model_launch(src: Source, values: Node, ses: Node, ms: Node) -> FoundLaunch:
    loc = Located(src)
    w = _Writer(src, loc)
    repo = scalar(ms.get("repository"))
    # lines 127-138
    w.made("/opt/venv/bin/vllm" if repo == "lmcache/vllm-openai" else "vllm")
    w.made("serve")
    w.value(ms, "modelURL")
    w.made("--host")
    w.made("0.0.0.0")
    w.made("--port")
    port = ses.get("containerPort")
    w.words.append(Word(_go_text(port), loc.node_span(port)) if port is not None else Word(DEFAULT_PORT))
    if _truthy(ms.get("enableLoRA")):  # 139-141
        w.flag(ms, "enableLoRA", "--enable-lora")
    if _truthy(ms.get("enableTool")):  # 142-144
        w.flag(ms, "enableTool", "--enable-auto-tool-choice")
    if _truthy(ms.get("toolCallParser")):  # 145-148
        w.flag(ms, "toolCallParser", "--tool-call-parser")
        w.value(ms, "toolCallParser")
    vc = ms.get("vllmConfig")
    if _truthy(vc) and vc is not None:  # 149: ``with $modelSpec.vllmConfig``
        _vllm_config(w, ms, vc)
    if _truthy(ms.get("modelRevision")):  # 200-203
        w.flag(ms, "modelRevision", "--revision")
        w.value(ms, "modelRevision")
    lmc = ms.get("lmcacheConfig")
    if _truthy(lmc) and lmc is not None and _truthy(lmc.get("enabled")):  # 204-217
        w.flag(ms, "lmcacheConfig", "--kv-transfer-config")
        w.words.append(Word(_kv_transfer(lmc, vc), w.key_span(ms, "lmcacheConfig")))
    if _truthy(ms.get("chatTemplate")):  # 218-221
        w.flag(ms, "chatTemplate", "--chat-template")
        w.words.append(Word("/templates/" + _go_text(ms.get("chatTemplate")), w.at(ms.get("chatTemplate"))))
    words = [Word("vllm", None), *w.words[1:]] if w.words[0].text.endswith("/vllm") else w.words
    return FoundLaunch(
        kind="helm",
        at=loc.node_span(ms),
        words=words,
        env=_env(src, loc, values, ses, ms, vc),
        gpu_count=_gpus(ms, loc),
        gpu_product=_product(ms),
        name=scalar(ms.get("name")),
        problems=dedupe(loc.problems),
    )


def _vllm_config(w: _Writer, ms: Node, vc: Node) -> None:
    """Lines 150-198, in the template's order."""
    if vc.get("enableChunkedPrefill") is not None:
        on = _truthy(vc.get("enableChunkedPrefill"))
        w.flag(vc, "enableChunkedPrefill", "--enable-chunked-prefill" if on else "--no-enable-chunked-prefill")
    # 157-161: one of the two is always written, so an entry without the key turns prefix caching off
    on = _truthy(vc.get("enablePrefixCaching"))
    flag = "--enable-prefix-caching" if on else "--no-enable-prefix-caching"
    if vc.get("enablePrefixCaching") is not None:
        w.flag(vc, "enablePrefixCaching", flag)
    else:
        w.flag(ms, "vllmConfig", flag)
    for key, opt in (
        ("maxModelLen", "--max-model-len"),
        ("dtype", "--dtype"),
        ("tensorParallelSize", "--tensor-parallel-size"),
        ("maxNumSeqs", "--max-num-seqs"),
        ("gpuMemoryUtilization", "--gpu_memory_utilization"),
        ("maxLoras", "--max_loras"),
        ("runner", "--runner"),
        ("convert", "--convert"),
    ):
        if vc.get(key) is not None:  # ``hasKey``
            w.flag(vc, key, opt)
            w.value(vc, key)
    extra = vc.get("extraArgs")
    if _truthy(extra) and extra is not None:
        for item in extra.items if extra.kind == "seq" else []:
            w.words.append(Word(_go_text(item), w.at(item)))


def _kv_transfer(lmc: Node, vc: Node | None) -> str:
    """Lines 5-12 (the role) and 206-215 (the connector JSON), character for character."""
    role = _go_text(lmc.get("kvRole")) if _truthy(lmc.get("kvRole")) else "kv_both"
    if lmc.get("enablePD") is not None:
        port = json.dumps(_go_text(lmc.get("nixlRole"))) if lmc.get("nixlRole") is not None else ""
        return (
            '{"kv_connector":"LMCacheConnectorV1","kv_role":"' + role + '","kv_connector_extra_config":'
            '{"discard_partial_chunks": false, "lmcache_rpc_port": ' + port + "}}"
        )
    v0 = vc.get("v0") if vc is not None else None
    if v0 is not None and _go_text(v0) == "1":
        return '{"kv_connector":"LMCacheConnector","kv_role":"' + role + '"}'
    return '{"kv_connector":"LMCacheConnectorV1","kv_role":"' + role + '"}'


def _env(src: Source, loc: Located, values: Node, ses: Node, ms: Node, vc: Node | None) -> dict[str, str]:
    """The VLLM_* / HF_* variables the container gets (lines 223-393): HF_HOME, VLLM_USE_V1 for ``v0: "1"``,
    servingEngineSpec.env then modelSpec.env, VLLM_RPC_TIMEOUT with LMCache. HF_TOKEN and VLLM_API_KEY come from
    secrets (valueFrom) and are not in the file."""
    shared = _truthy(values.path("sharedPvcStorage", "enabled"))
    env = {"HF_HOME": "/data/shared-pvc-storage" if shared else "/data" if ms.get("pvcStorage") is not None else "/tmp"}
    if _truthy(vc) and vc is not None and vc.get("v0") is not None and _go_text(vc.get("v0")) == "1":
        env["VLLM_USE_V1"] = "0"
    for node in (ses.get("env"), ms.get("env")):
        env.update(read_env(src, node, loc, {}).plain())
    lmc = ms.get("lmcacheConfig")
    if _truthy(lmc) and lmc is not None and _truthy(lmc.get("enabled")):
        env["VLLM_RPC_TIMEOUT"] = "1000000"
    return server_env(env)


def _gpus(ms: Node, loc: Located) -> int | None:
    """Lines 413-417: ``resources`` as given, else chart.resources (helm/templates/_helpers.tpl:167-207), whose
    GPU line is ``requestGPU`` under ``requestGPUType`` (default nvidia.com/gpu) when requestGPU > 0."""
    if _truthy(ms.get("resources")):
        return gpu_count(ms, loc)
    req = ms.get("requestGPU")
    gtype = scalar(ms.get("requestGPUType")) or "nvidia.com/gpu"
    if req is None or gtype != "nvidia.com/gpu":
        return None
    n = as_int(req)
    if n is None:
        loc.problems.append((loc.node_span(req), f"requestGPU {req.text!r} is not a whole number of GPUs"))
    return n if n else None


def _product(ms: Node) -> str | None:
    """Lines 529-540: ``affinity`` as given, else ``nodeSelectorTerms`` as a required node affinity (not with
    ``nodeName``); a ``nvidia.com/gpu.product`` term with one value names the GPU."""
    aff = ms.get("affinity")
    if _truthy(aff) and aff is not None:
        terms = aff.path("nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
    elif _truthy(ms.get("nodeSelectorTerms")) and not _truthy(ms.get("nodeName")):
        terms = ms.get("nodeSelectorTerms")
    else:
        return None
    node = affinity_product(terms)
    return node.text.strip() if node is not None and node.kind == "scalar" else None


class _Writer:
    """The argv as the template writes it, each word placed where its value came from."""

    def __init__(self, src: Source, loc: Located) -> None:
        self.src, self.loc = src, loc
        self.words: list[Word] = []

    def at(self, node: Node | None) -> Span | None:
        return self.loc.node_span(node) if node is not None else None

    def key_span(self, mapping: Node, key: str) -> Span | None:
        for k, _ in mapping.items if mapping.kind == "map" else []:
            if k.kind == "scalar" and k.text == key:
                return self.loc.node_span(k)
        return None

    def made(self, text: str) -> None:
        self.words.append(Word(text))

    def flag(self, mapping: Node, key: str, text: str) -> None:
        self.words.append(Word(text, self.key_span(mapping, key)))

    def value(self, mapping: Node, key: str) -> None:
        """``{{ .key | quote }}``: a null value prints nothing (sprig's quote skips nil), an empty list item."""
        node = mapping.get(key)
        if node is None or node.is_null or node.kind != "scalar":
            span = self.key_span(mapping, key) or self.loc.node_span(mapping)
            self.loc.problems.append((span, f"{key} has no value: the chart writes an empty argument"))
            self.words.append(Word("", span))
            return
        self.words.append(Word(_go_text(node), self.at(node)))


def _truthy(node: Node | None) -> bool:
    """Go template truth: false, 0, nil, "" and empty collections are false (a quoted "false" is true)."""
    if node is None:
        return False
    if node.kind != "scalar":
        return bool(node.items)
    t = scalar_type(node)
    if t == "null":
        return False
    if t == "bool":
        return node.text.lower() in ("true", "yes", "on", "y")
    if t in ("int", "float"):
        try:
            return float(node.text.replace("_", "")) != 0
        except ValueError:
            return True
    return node.text != ""


def _falsy(node: Node | None, default: bool) -> bool:
    return not (default if node is None else _truthy(node))


def _go_text(node: Node | None) -> str:
    """A value as ``quote`` / ``{{ }}`` print it: numbers are float64 printed with Go's ``%v``."""
    if node is None or node.kind != "scalar" or node.is_null:
        return ""
    t = scalar_type(node)
    if t == "bool":
        return "true" if node.text.lower() in ("true", "yes", "on", "y") else "false"
    if t in ("int", "float"):
        try:
            text = node.text.replace("_", "")
            value = float(int(text, 0)) if t == "int" else float(text)
        except ValueError:
            return node.text
        return go_float(value)
    return node.text


def go_float(v: float) -> str:
    """Go's ``%v`` of a float64: strconv's 'g' with the shortest digits, which uses %e when the exponent is below -4
    or at least 6 (strconv/ftoa.go: "if precision was the shortest possible, use precision 6 for this decision"),
    so 1000000 prints as 1e+06 and 1048576 as 1.048576e+06."""
    if v != v or v in (float("inf"), float("-inf")):
        return "NaN" if v != v else "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "0"
    sign, digits, exp = Decimal(repr(v)).normalize().as_tuple()
    ds = "".join(map(str, digits))
    dp = len(ds) + int(exp)  # position of the decimal point
    x = dp - 1
    neg = "-" if sign else ""
    if x < -4 or x >= 6:
        mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        return f"{neg}{mant}e{'+' if x >= 0 else '-'}{abs(x):02d}"
    if dp <= 0:
        return f"{neg}0.{'0' * -dp}{ds}"
    if dp >= len(ds):
        return f"{neg}{ds}{'0' * (dp - len(ds))}"
    return f"{neg}{ds[:dp]}.{ds[dp:]}"
