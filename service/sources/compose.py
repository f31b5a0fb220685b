"""Docker Compose files: each service whose process is vLLM's server.

The process is ``entrypoint`` + ``command`` (compose-spec services.md: ``command`` overrides the image's CMD and
follows the ENTRYPOINT; ``entrypoint`` replaces the image's and clears its CMD); a string is split into words as the
shell would, without expanding them (Compose splits with go-shellwords, which leaves ``$X`` as written); without
``entrypoint`` the vllm/vllm-openai image's ENTRYPOINT comes first (entrypoints.py says which). Values are interpolated as Compose does (``${VAR:-default}``).

GPUs: ``deploy.resources.reservations.devices`` entries with the ``gpu`` capability (``count``, or the number of
``device_ids``; ``count: all`` says nothing about how many), the service-level ``gpus:`` of the same shape, and
``runtime: nvidia`` with ``NVIDIA_VISIBLE_DEVICES`` listing devices."""

from __future__ import annotations

import pathlib
import re

from .containers import Hit, Located, LStr, compose_interpolate, process_words, report_unexpanded, server_env
from .entrypoints import is_vllm_image
from .found import FoundLaunch, SourceError, Word
from .kube import dedupe, scalar
from .shellwords import ShellSyntaxError, read_commands
from .yaml_load import Node, Source, as_int, load_all, pairs


def claims(_path: pathlib.Path | str, text: str) -> bool:
    """A compose file: a top-level ``services:`` mapping (checked on the text, without parsing)."""
    return bool(re.search(r"(?m)^services:[ \t]*(?:#.*)?$", text))


def read(path: pathlib.Path | str, text: str) -> list[FoundLaunch]:
    """Every service of a compose file that runs vLLM's server. Raises YamlError for a file it cannot read."""
    src, docs = load_all(str(path), text)
    out: list[FoundLaunch] = []
    for doc in docs[:1]:
        services = doc.get("services")
        for name, svc in pairs(services):
            if svc.kind == "map":
                out += service_launches(src, name, svc)
    return out


def service_launches(src: Source, name: str, svc: Node) -> list[FoundLaunch]:
    loc = Located(src)
    env = read_environment(src, svc.get("environment"))
    entry = argv_of(src, svc.get("entrypoint"), loc)
    cmd = argv_of(src, svc.get("command"), loc)
    image = scalar(svc.get("image"))
    values: dict[str, LStr | None] = dict(env)
    if entry is None:
        if not is_vllm_image(image):
            if cmd is None:
                return []
            hits = process_words(cmd, values, loc, "compose")
        else:
            words = [Word("vllm"), Word("serve"), *(Word(a.text, loc.span(a.off(0))) for a in cmd or [])]
            report_unexpanded(words, loc, values, "compose")
            hits = [Hit(words, {})]
    else:
        hits = process_words(entry + (cmd or []), values, loc, "compose")
    gpus = gpu_count(svc, env, loc)
    plain = server_env({k: v.text if v is not None else None for k, v in env.items()})
    return [
        FoundLaunch(
            kind="compose",
            at=loc.node_span(svc),
            words=hit.words,
            env=server_env(hit.env) if hit.complete else plain | server_env(hit.env),
            gpu_count=gpus,
            name=name,
            problems=dedupe([*loc.problems, *hit.problems]),
            notes=hit.notes,
        )
        for hit in hits
    ]


def argv_of(src: Source, node: Node | None, loc: Located) -> list[LStr] | None:
    """``command`` / ``entrypoint``: a list (each element one word) or a string split as shell words."""
    if node is None or node.is_null:
        return None
    if node.kind == "seq":
        return [compose_interpolate(LStr.of(src, n)) for n in node.items if n.kind == "scalar"]
    if node.kind != "scalar":
        return None
    s = compose_interpolate(LStr.of(src, node))
    try:
        commands = read_commands(s.text)
    except ShellSyntaxError as e:
        raise SourceError(f"cannot be split into words: {e}", loc.span(s.off(e.offset))) from None
    return [LStr.made(w.written, s.off(w.offset)) for c in commands for w in c.words]


def read_environment(src: Source, node: Node | None) -> dict[str, LStr | None]:
    """``environment``: a mapping or a list of ``KEY=VALUE`` (a bare ``KEY`` is taken from the host: UNSET)."""
    out: dict[str, LStr | None] = {}
    if node is None:
        return out
    if node.kind == "map":
        for k, v in pairs(node):
            out[k] = None if v.is_null else compose_interpolate(LStr.of(src, v)) if v.kind == "scalar" else None
    elif node.kind == "seq":
        for item in node.items:
            if item.kind != "scalar":
                continue
            s = compose_interpolate(LStr.of(src, item))
            k, eq, _ = s.text.partition("=")
            if not eq:
                out[k] = None
                continue
            i = len(k) + 1
            out[k] = LStr(s.text[i:], s.offs[i:], s.off(i))
    return out


def gpu_count(svc: Node, env: dict[str, LStr | None], loc: Located) -> int | None:
    devices = svc.path("deploy", "resources", "reservations", "devices")
    for dev in devices.items if devices is not None and devices.kind == "seq" else []:
        n = _device_count(dev, loc)
        if n is not None:
            return n
    gpus = svc.get("gpus")
    if gpus is not None and gpus.kind == "seq":
        for dev in gpus.items:
            n = _device_count(dev, loc, need_capability=False)
            if n is not None:
                return n
    if scalar(svc.get("runtime")) == "nvidia":
        vis = env.get("NVIDIA_VISIBLE_DEVICES")
        if vis is not None and re.fullmatch(r"\d+(,\d+)*", vis.text.strip()):
            return len(vis.text.split(","))
    return None


def _device_count(dev: Node, loc: Located, need_capability: bool = True) -> int | None:
    if dev.kind != "map":
        return None
    caps = dev.get("capabilities")
    cap_words = {c.text for c in caps.items if c.kind == "scalar"} if caps is not None and caps.kind == "seq" else set()
    if need_capability and "gpu" not in cap_words:
        return None
    ids = dev.get("device_ids")
    if ids is not None and ids.kind == "seq":
        return len(ids.items)
    count = dev.get("count")
    if count is None or scalar(count) == "all":
        return None
    n = as_int(count)
    if n is None:
        loc.problems.append((loc.node_span(count), f"count {count.text!r} is not a whole number of GPUs"))
    return n
