"""KServe: InferenceServices and (Cluster)ServingRuntimes.

Three forms, and which process each runs:

- ``spec.predictor.containers``: a custom container — read as any Kubernetes container (``vllm serve`` or vLLM's
  OpenAI server, often the vllm/vllm-openai image).
- ``spec.predictor.model`` with ``runtime:`` naming a ServingRuntime in the same file: KServe runs the runtime's
  container with the model's ``args`` appended and ``{{.Name}}`` replaced by the InferenceService's name; when that
  container runs ``vllm serve`` / the OpenAI server (the usual "vLLM ServingRuntime for KServe"), it is a launch.
- ``spec.predictor.model.modelFormat.name: huggingface``: **not** ``vllm serve`` but KServe's own Hugging Face
  server (kserve python/huggingfaceserver/huggingfaceserver/__main__.py), which builds vLLM's engine arguments from
  its command line (``build_vllm_engine_args``) when its backend is vLLM (``--backend`` auto or vllm). It is read as
  the ``vllm serve`` it amounts to: ``--model_id`` (or the downloaded ``storageUri`` at /mnt/models) is the model,
  ``--model_revision`` is ``--revision``, ``--max_length`` is ``--max-model-len``, KServe's own options are dropped,
  every other option goes to vLLM's parser; and KServe turns ``--dtype auto`` (vLLM's default) into float16 on a
  GPU (``args.dtype = default_dtype``), so that is written in, without a place when the file does not say it.
  ``--backend huggingface`` is no vLLM launch.

A ServingRuntime that no InferenceService of the file uses is read on its own (its ``{{.Name}}`` left as written)."""

from __future__ import annotations

import re

from .containers import Located, LStr, k8s_expand, report_unexpanded, unescape
from .found import FoundLaunch, Word
from .kube import container_launches, dedupe, gpu_count, gpu_product, read_env, scalar, str_list
from .yaml_load import Node, Source

MODEL_DIR = "/mnt/models"  # where KServe's storage initializer puts storageUri (huggingfaceserver's --model_dir)
# KServe's own options, with whether each takes a value: kserve python/kserve/kserve/model_server.py (the parent
# parser) and huggingfaceserver/__main__.py. The rest of the command line is vLLM's (maybe_add_vllm_cli_parser).
KSERVE_OPTIONS = {
    **dict.fromkeys(
        (
            "http_port grpc_port workers max_threads max_asyncio_workers enable_grpc enable_docs_url "
            "enable_latency_logging configure_logging log_config_file access_log_format model_name predictor_host "
            "protocol predictor_protocol predictor_use_ssl predictor_request_timeout_seconds model_dir model_id "
            "tokenizer_revision tensor_input_names task backend max_log_len max-log-len"
        ).split(),
        True,
    ),
    **dict.fromkeys(
        "disable_lower_case disable_special_tokens return_token_type_ids return_probabilities disable_log_requests".split(),
        False,
    ),
}


def read_kserve_object(src: Source, obj: Node, docs: list[Node]) -> list[FoundLaunch]:
    kind = scalar(obj.get("kind"))
    name = scalar(obj.path("metadata", "name")) or "?"
    spec = obj.get("spec")
    if spec is None or spec.kind != "map":
        return []
    if kind in ("ServingRuntime", "ClusterServingRuntime"):
        if any(_uses(d, name) for d in docs):
            return []  # read with the InferenceService that runs it
        return runtime_launches(src, spec, name=f"{kind.lower()}/{name}")
    predictor = spec.get("predictor")
    if predictor is None or predictor.kind != "map":
        return []
    label = f"inferenceservice/{name}"
    ctns = predictor.get("containers")
    if ctns is not None and ctns.kind == "seq":
        from .kube import pod_launches

        return pod_launches(src, predictor, kind="kserve", name=label)
    model = predictor.get("model")
    if model is None or model.kind != "map":
        return []
    runtime = _runtime(docs, scalar(model.get("runtime")))
    if runtime is not None:
        return runtime_launches(src, runtime, name=label, model=model, predictor=predictor, isvc=name)
    if (scalar(model.path("modelFormat", "name")) or "").lower() == "huggingface":
        return huggingface_launch(src, predictor, model, label)
    return []


def _uses(doc: Node, runtime: str) -> bool:
    return (
        scalar(doc.get("kind")) == "InferenceService"
        and scalar(doc.path("spec", "predictor", "model", "runtime")) == runtime
    )


def _runtime(docs: list[Node], name: str | None) -> Node | None:
    for d in docs:
        if name and scalar(d.get("kind")) in ("ServingRuntime", "ClusterServingRuntime"):
            if scalar(d.path("metadata", "name")) == name:
                return d.get("spec")
    return None


def runtime_launches(
    src: Source,
    spec: Node,
    *,
    name: str,
    model: Node | None = None,
    predictor: Node | None = None,
    isvc: str | None = None,
) -> list[FoundLaunch]:
    """A ServingRuntime's containers, with an InferenceService's model merged in as KServe merges it: the model's
    args after the container's, its env after the container's, its resources in place of the container's."""
    ctns = spec.get("containers")
    if ctns is None or ctns.kind != "seq":
        return []
    loc = Located(src)
    product = gpu_product(predictor) if predictor is not None else None
    extra_args = (model.get("args") if model is not None else None) or None
    out: list[FoundLaunch] = []
    for ctn in ctns.items:
        if ctn.kind != "map":
            continue
        found = container_launches(
            src,
            ctn,
            kind="kserve",
            name=name,
            product=product or (gpu_product(spec) if predictor is None else None),
            pod_problems=loc.problems,
            args_after=extra_args.items if extra_args is not None and extra_args.kind == "seq" else None,
            rename={"{{.Name}}": isvc} if isvc else None,
        )
        for f in found:
            if model is not None:
                mloc = Located(src)
                menv = read_env(src, model.get("env"), mloc, {})
                f.env.update(menv.plain())
                g = gpu_count(model, mloc)
                f.gpu_count = g if g is not None else f.gpu_count
                f.problems = dedupe([*f.problems, *mloc.problems])
        out += found
    return out


def huggingface_launch(src: Source, predictor: Node, model: Node, label: str) -> list[FoundLaunch]:
    """KServe's Hugging Face server read as the ``vllm serve`` it builds (see the module docstring)."""
    loc = Located(src)
    env = read_env(src, model.get("env"), loc, {})
    args = [k8s_expand(a, env.values) for a in (str_list(src, model.get("args"), loc, "args") or [])]
    split = _split_options(args, loc)
    values = {k: v for k, v, _ in split}
    backend = values.get("backend")
    if backend is not None and backend[0].text not in ("auto", "vllm"):
        return []
    storage = model.get("storageUri")
    if "model_id" in values:
        model_word = values["model_id"][0]
    elif "model_dir" in values:
        model_word = values["model_dir"][0]
    else:
        model_word = Word(MODEL_DIR, loc.node_span(storage) if storage is not None else None)
    words = [Word("vllm"), Word("serve"), model_word]
    has_dtype = False
    for key, vals, flag in split:
        if key in ("model_revision",):
            words += [Word("--revision", flag.at), *vals]
        elif key == "max_length":
            words += [Word("--max-model-len", flag.at), *vals]
        elif key in KSERVE_OPTIONS:
            continue
        else:
            if key == "dtype":
                has_dtype = True
                vals = [Word("float16", v.at) if v.text == "auto" else v for v in vals]
            words += [flag, *vals] if flag.text else vals
    if not has_dtype:
        words += [Word("--dtype"), Word("float16")]
    report_unexpanded(words, loc, env.values, "kubernetes")
    words = unescape(words)
    return [
        FoundLaunch(
            kind="kserve",
            at=loc.node_span(model),
            words=words,
            env=env.plain(),
            gpu_count=gpu_count(model, loc),
            gpu_product=gpu_product(predictor),
            name=f"{label}/kserve-container",
            problems=dedupe(loc.problems),
        )
    ]


_OPT = re.compile(r"--([A-Za-z0-9][A-Za-z0-9_.-]*)")


def _split_options(args: list[LStr], loc: Located) -> list[tuple[str, list[Word], Word]]:
    """The command line as (option name, its value words, the option word); ``--k=v`` split at ``=``, the value
    located after it. An option of KServe's takes a value when KSERVE_OPTIONS says so; vLLM's options are kept
    with whatever follows them up to the next option (the parse judges them)."""
    out: list[tuple[str, list[Word], Word]] = []
    for a in args:
        at = loc.span(a.offs[0] if a.offs else a.start)
        m = _OPT.match(a.text)
        if m is None:
            if out:
                out[-1][1].append(Word(a.text, at))
            else:
                out.append(("", [Word(a.text, at)], Word("", at)))
            continue
        key = m.group(1)
        if "=" in a.text:
            i = a.text.index("=")
            flag = Word(a.text[:i], at)
            val = Word(a.text[i + 1 :], loc.span(a.off(i + 1)))
            if KSERVE_OPTIONS.get(key) is False:
                out.append((key, [], Word(a.text, at)))
            else:
                out.append((key, [val], flag))
        else:
            out.append((key, [], Word(a.text, at)))
    return out
