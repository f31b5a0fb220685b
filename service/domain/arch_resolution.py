"""How a vLLM release resolves the checkpoint's ``architectures`` when its model registry does not name them, and
whether it then refuses the launch: per release, from vLLM's own code.

- 0.6 has no Transformers fallback: an unregistered architecture is refused when the engine config is built
  (vllm 0.6.6 vllm/model_executor/models/registry.py:374-385, 410-421).
- 0.7-0.9 accept it when the engine config is built (registry ``_normalize_archs`` substitutes the Transformers
  backend: 0.7.3 registry.py:393-407, 0.9.2 registry.py:459-475) and decide when the model loads: every
  architecture must be a Transformers class (or, 0.7, auto_map's ``AutoModel`` from the repository) that is
  backend-compatible (0.7.3 vllm/model_executor/model_loader/utils.py:33-42, 45-83, 86-117; 0.8.5
  model_loader/utils.py:33-80; 0.9.2 model_loader/utils.py:169-220, 223-238).
- 0.10 on decide when the engine config is built (0.10.2 vllm/config/__init__.py:648, 739; 0.33.0
  vllm/config/model.py:705, 741): ``inspect_model_cls`` (0.10.2 registry.py:628-677; 0.33.0 registry.py:1367-1418)
  with ``--model-impl transformers`` resolves the first architecture through Transformers first; with ``auto`` and
  no registered architecture it tries the Transformers backend on the first architecture
  (``_try_resolve_transformers``: ``getattr(transformers, arch)``, else an ``auto_map`` ``AutoModel*`` class from
  the repository; 0.10.2 registry.py:539-600, 0.33.0 registry.py:1266-1339), then the suffix rewrite
  (``_normalize_arch``: ``FooForSequenceClassification`` -> a registered ``FooForCausalLM`` with an adapter; 0.10.2
  registry.py:602-626, 0.33.0 registry.py:1341-1365), then refuses (``_raise_for_unsupported``: 0.10.2
  registry.py:504-523, 0.33.0 registry.py:1221-1252). From 0.15 the repository class loads only with
  ``--trust-remote-code`` (0.15.1 vllm/transformers_utils/dynamic_module.py:37-42; 0.13.0 has no such check); from
  0.30 a class also passes when ``_can_set_attn_implementation()`` (0.30.0 registry.py:1278-1281; 0.28.0
  registry.py:1234 asks ``is_backend_compatible()`` alone).

Which Transformers classes exist and what they answer comes from service/domain/transformers_models.py. What a
repository's own code answers cannot be known offline: that case is a warning, never an error.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .transformers_models import ReleaseTransformers, release_transformers
from .versions import VersionLine, version_lines

MAX_ARCHS = 16  # architectures looked at (config.json lists one or two)
MAX_NAME = 200  # characters of an architecture name compared or quoted
ARCH_FIELD = "model.config.architectures"
REGISTRY_FALLBACK = "vllm/model_executor/models/registry.py"
TRUST_GATE = (0, 15, 0)
CAN_SET_ATTN = (0, 30, 0)
LOADER_07 = (0, 8, 0)  # before: 0.7's loader check (supports_backend / _supports_flex_attn)
TRANSFORMERS_BACKENDS = ("TransformersForCausalLM", "TransformersModel")
# (architecture, the registered name it becomes, (suffix, default runner, default convert))
Rewrite = tuple[str, str, tuple[str, str, str]]


@dataclass(frozen=True)
class Outcome:
    severity: str  # "error" | "warning" | "info"
    message: str
    remedy: dict[str, Any] | None = None
    field: str = ARCH_FIELD


@dataclass(frozen=True)
class Look:
    """What the release's Transformers fallback finds for one architecture in each Transformers it allows:
    ``compatible``, ``incompatible``, ``absent``, ``remote`` (auto_map's class from the repository: unknown) or
    ``unknown`` (not readable where the data was generated)."""

    arch: str
    states: tuple[tuple[str, str], ...]
    remote: str | None
    gated: str | None  # an auto_map AutoModel entry vLLM does not load without --trust-remote-code

    @property
    def answer(self) -> str:
        kinds = {s for _, s in self.states}
        if kinds == {"compatible"}:
            return "yes"
        if kinds <= {"absent", "incompatible"}:
            return "no"
        return "unknown"

    @property
    def absent(self) -> bool:
        return all(s == "absent" for _, s in self.states)

    def describe(self, line: VersionLine, rt: ReleaseTransformers) -> str:
        words = {
            "compatible": f"has {self.arch}, backend-compatible",
            "incompatible": f"has {self.arch}, not backend-compatible",
            "absent": f"has no class {self.arch}",
            "remote": f"has no class {self.arch}, so vLLM loads auto_map's {self.remote} from the repository",
            "unknown": f"has {self.arch} (not readable where Preflight's data was generated)",
        }
        parts = [f"transformers {v} {words[s]}" for v, s in self.states]
        if len({s for _, s in self.states}) == 1:
            versions = " and ".join(v for v, _ in self.states)
            parts = [f"transformers {versions} {words[self.states[0][1]]}".replace(" has ", " have ", 1)]
        text = "; ".join(parts) + f" (vLLM {line.newest} requires transformers{rt.requirement})"
        if self.gated:
            text += f"; auto_map's {self.gated} is not loaded without --trust-remote-code"
        return text


def compatible_test(line: VersionLine) -> Callable[[str], bool]:
    """What the release asks of a Transformers class (the letters of transformers_models)."""
    if line.release < LOADER_07:
        return lambda f: ("b" in f) if "k" in f else ("f" in f)
    if line.release < CAN_SET_ATTN:
        return lambda f: "b" in f
    return lambda f: "b" in f or "s" in f


def remote_entry(auto_map: Any, line: VersionLine, trust: bool) -> tuple[str | None, str | None]:
    """The auto_map class vLLM would load from the repository, and one it skips for want of
    --trust-remote-code."""
    if not isinstance(auto_map, Mapping):
        return None, None
    if line.release < (0, 10, 0):  # the loader reads auto_map["AutoModel"] exactly
        value = auto_map.get("AutoModel")
        return (value[:MAX_NAME] if isinstance(value, str) else None), None
    for key, value in itertools.islice(auto_map.items(), MAX_ARCHS):
        if isinstance(key, str) and key.startswith("AutoModel") and isinstance(value, str):
            if line.release >= TRUST_GATE and not trust:
                return None, value[:MAX_NAME]
            return value[:MAX_NAME], None
    return None, None


def look(arch: str, line: VersionLine, rt: ReleaseTransformers, remote: tuple[str | None, str | None]) -> Look:
    test = compatible_test(line)
    entry, gated = remote
    states = []
    for version, classes in zip(rt.versions, rt.classes, strict=True):
        flags = classes.get(arch)
        if line.release < LOADER_07 and entry:  # 0.7: the repository's AutoModel comes first
            state = "remote"
        elif flags is None:
            state = "remote" if entry else "absent"
        elif "?" in flags:
            state = "unknown"
        else:
            state = "compatible" if test(flags) else "incompatible"
        states.append((version, state))
    return Look(arch, tuple(states), entry, gated)


def rewrite(archs: tuple[str, ...], line: VersionLine, rt: ReleaseTransformers) -> Rewrite | None:
    """``_normalize_arch``: the first suffix an architecture ends with, swapped for each suffix in turn until the
    name is registered (str.replace, as vLLM does)."""
    for arch in archs:
        match = next((row for row in rt.suffixes if arch.endswith(row[0])), None)
        if match is None:
            continue
        for repl, _, _ in rt.suffixes:
            base = arch.replace(match[0], repl)
            if base in line.architectures:
                return arch, base, match
    return None


def nearest(arch: str, line: VersionLine) -> list[str]:
    return difflib.get_close_matches(arch, list(line.architectures), n=3, cutoff=0.6)


def registering_release(arch: str, line: VersionLine) -> str | None:
    """The nearest generated release that registers ``arch``: a newer one first."""
    lines = version_lines()
    newer = [ln for ln in lines if ln.release > line.release and arch in ln.architectures]
    older = [ln for ln in lines if ln.release < line.release and arch in ln.architectures]
    if newer:
        return newer[0].newest
    return older[-1].newest if older else None


def judge(archs: tuple[str, ...], line: VersionLine, impl: str, trust: bool, auto_map: Any) -> Outcome | None:
    """The release's verdict on the checkpoint's architectures (None: nothing to say)."""
    archs = tuple(a[:MAX_NAME] for a in archs[:MAX_ARCHS])
    if not archs or impl == "terratorch":
        return None
    registered = any(a in line.architectures for a in archs)
    rt = release_transformers(line.newest)
    if rt is None:
        return None if registered else without_data(archs, line)
    if rt.fallback is None:
        why = f"vLLM {line.newest} has no Transformers fallback"
        return None if registered else refused(archs, line, why)
    remote = remote_entry(auto_map, line, trust)
    if not rt.fallback.startswith(REGISTRY_FALLBACK):
        return at_load(archs, line, rt, impl, remote, registered)
    if impl == "transformers":
        return explicit_transformers(archs, line, rt, remote)
    if registered:
        return None
    found = look(archs[0], line, rt, remote) if impl == "auto" else None
    rewritten = rewrite(archs, line, rt)
    # The engine's last inspection runs with the resolved --convert (the suffix's default): a pooling suffix
    # (convert embed/classify) skips the Transformers backend, tried only while convert is "none", and takes the
    # adapter (0.33.0 registry.py:1389-1405).
    if rewritten is not None and rewritten[2][2] != "none":
        return adapted(rewritten, line, rt)
    if found is not None and found.answer == "yes":
        return taken(found, line, rt)
    if rewritten is not None:
        return adapted(rewritten, line, rt)
    if found is not None and found.answer == "unknown":
        return uncertain(archs, found, line, rt)
    if found is None:
        return refused(archs, line, f"--model-impl {impl[:40]} leaves out the Transformers backend")
    return refused(archs, line, f"Its Transformers backend cannot take it: {found.describe(line, rt)}", found.gated)


def removed_or_plugin(archs: tuple[str, ...], line: VersionLine, why: str) -> Outcome | None:
    """``_raise_for_unsupported``'s first answers: an architecture the release lists as removed or moved out."""
    for arch in archs:
        if arch in line.previously_supported:
            until = line.previously_supported[arch]
            return Outcome(
                "error",
                f"Model architecture {arch} was supported in vLLM until v{until}, and is not supported anymore "
                f"(vLLM {line.newest}; {why}). Serve it with vLLM ≤ {until} or use a successor checkpoint with a "
                f"supported architecture.",
                {"vllm_version": until},
            )
        if arch in line.out_of_tree:
            plugin = line.out_of_tree[arch]
            return Outcome(
                "error",
                f"Model architecture {arch} is not supported in-tree anymore (vLLM {line.newest}); install the plugin "
                f"{plugin}.",
                {"plugin": plugin},
            )
    return None


def refused(archs: tuple[str, ...], line: VersionLine, why: str, gated: str | None = None) -> Outcome:
    """vLLM's refusal when nothing resolves the architectures."""
    out = removed_or_plugin(archs, line, why)
    if out is not None:
        return out
    near = nearest(archs[0], line)
    elsewhere = registering_release(archs[0], line)
    message = (
        f"Model architectures {list(archs)} are not supported for now. Supported architectures: dict_keys([...]) "
        f"(the {len(line.architectures)} architectures of vLLM {line.newest}'s model registry"
        + (f"; nearest: {', '.join(near)}" if near else "")
        + f"). {why}."
        + (f" vLLM {elsewhere} registers {archs[0]}." if elsewhere else "")
    )
    remedy: dict[str, Any] | None = {"vllm_version": elsewhere} if elsewhere else None
    if gated and not elsewhere:
        remedy = {"trust_remote_code": True}
    return Outcome("error", message, remedy)


def without_data(archs: tuple[str, ...], line: VersionLine) -> Outcome:
    """No Transformers data for this release: the removals are still certain, the rest is a warning."""
    out = removed_or_plugin(archs, line, "not in its model registry")
    if out is not None:
        return out
    return Outcome(
        "warning",
        f"Model architecture {archs[0]} is not in vLLM {line.newest}'s model registry; vLLM falls back to its "
        f"Transformers backend, which loads it only if the installed Transformers has the model (or with "
        f"--trust-remote-code and the repository's code). Otherwise it fails with 'Model architectures "
        f"{list(archs)} are not supported for now'. (Preflight has no Transformers data for vLLM {line.newest}.)",
    )


def taken(found: Look, line: VersionLine, rt: ReleaseTransformers) -> Outcome:
    """The Transformers backend takes the architecture (every allowed Transformers agrees)."""
    text = (
        f"{found.arch} is not in vLLM {line.newest}'s model registry; vLLM serves it with its Transformers modeling "
        f"backend ({found.describe(line, rt)}): Transformers' modeling code with vLLM's attention, usually slower "
        f"and with fewer features than a native implementation."
    )
    until = line.previously_supported.get(found.arch)
    if until:
        # vLLM's config code hands a removed architecture to the Transformers backend, but vLLM dropped its own
        # implementation because the engine no longer runs the model (Mllama: cross-attention, removed after 0.10.2
        # with the V0 engine; vllm-project/vllm#9015 is the public launch): refused, as the registry's removal says
        return Outcome(
            "error",
            f"Model architecture {found.arch} was supported in vLLM until v{until}, and is not supported anymore "
            f"(vLLM {line.newest}). {text} Preflight does not count on that backend for an architecture vLLM removed: "
            f"serve it with vLLM ≤ {until}.",
            {"vllm_version": until},
        )
    return Outcome("info", text)


def adapted(rewritten: Rewrite, line: VersionLine, rt: ReleaseTransformers) -> Outcome:
    arch, base, (suffix, runner, convert) = rewritten
    adapter = f"; vLLM wraps it with its {convert} adapter" if convert != "none" else ""
    return Outcome(
        "info",
        f"{arch} is not in vLLM {line.newest}'s model registry; vLLM resolves it to the registered {base} (the "
        f"suffix {suffix} defaults to runner {runner}, convert {convert}{adapter}; vllm {line.newest} "
        f"{rt.suffixes_at}).",
    )


def _check_text(line: VersionLine) -> str:
    if line.release < LOADER_07:
        return "is_backend_compatible() where it has supports_backend, else _supports_flex_attn"
    if line.release < CAN_SET_ATTN:
        return "is_backend_compatible(), i.e. _supports_attention_backend = True"
    return "is_backend_compatible() or _can_set_attn_implementation()"


def uncertain(
    archs: tuple[str, ...], found: Look, line: VersionLine, rt: ReleaseTransformers, failure: str | None = None
) -> Outcome:
    """The backend's answer depends on what is installed or on the repository's code."""
    near = nearest(found.arch, line)
    said = failure or f"Model architectures {list(archs)} are not supported for now"
    return Outcome(
        "warning",
        f"{found.arch} is not in vLLM {line.newest}'s model registry; its Transformers backend takes it only if the "
        f"class it finds passes {_check_text(line)}: {found.describe(line, rt)}. Otherwise vLLM fails with "
        f"'{said.rstrip('.')}'" + (f" (nearest registered: {', '.join(near)})" if near else "") + ".",
    )


def explicit_transformers(
    archs: tuple[str, ...], line: VersionLine, rt: ReleaseTransformers, remote: tuple[str | None, str | None]
) -> Outcome | None:
    """``--model-impl transformers``: the first architecture must resolve through Transformers, registered or
    not; ``_try_resolve_transformers`` raises when it does not (0.33.0 registry.py:1314-1337)."""
    arch = archs[0]
    if arch.startswith("Transformers") and arch in line.architectures:  # vLLM's own backend names
        return None
    found = look(arch, line, rt, remote)
    if found.answer == "yes":
        return None
    remedy = {"model_impl": "auto"} if any(a in line.architectures for a in archs) else None
    if found.answer == "unknown":
        return Outcome(
            "warning",
            f"--model-impl transformers: vLLM {line.newest} takes {arch} only if the class it finds passes "
            f"{_check_text(line)}: {found.describe(line, rt)}.",
            remedy,
            "engine_args.model_impl",
        )
    if found.absent:
        said = (
            f"Cannot find model module. {arch!r} is not a registered model in the Transformers library (only relevant "
            f"if the model is meant to be in Transformers) and 'AutoModel' is not present in the model config's "
            f"'auto_map' (relevant if the model is custom)."
        )
    else:
        said = f"The Transformers implementation of {arch!r} is not compatible with vLLM."
    return Outcome(
        "error",
        f"{said} (--model-impl transformers, vLLM {line.newest}: {found.describe(line, rt)})",
        remedy,
        "engine_args.model_impl",
    )


def at_load(
    archs: tuple[str, ...],
    line: VersionLine,
    rt: ReleaseTransformers,
    impl: str,
    remote: tuple[str | None, str | None],
    registered: bool,
) -> Outcome | None:
    """0.7-0.9: the engine config accepts any architecture; the model loader resolves every one through
    Transformers when none is registered or ``--model-impl transformers``, and raises on the first it cannot use."""
    if registered and impl != "transformers":
        return None
    if impl not in ("auto", "transformers"):  # the loader skips its check and loads the backend class as it is
        return without_data(archs, line)
    looks = [look(a, line, rt, remote) for a in archs if a not in TRANSFORMERS_BACKENDS]
    bad = next((lk for lk in looks if lk.answer == "no"), None)
    if bad is not None:
        return load_refusal(bad, line, rt, impl)
    unsure = next((lk for lk in looks if lk.answer == "unknown"), None)
    if unsure is not None:
        # the repository's class or an uncertain Transformers class failing the check raises this
        said = load_said(Look(unsure.arch, (("", "incompatible"),), None, None), line, impl)
        return uncertain(archs, unsure, line, rt, said)
    return taken(looks[0], line, rt) if looks and not registered else None


def load_said(found: Look, line: VersionLine, impl: str) -> str:
    """What the 0.7-0.9 model loader raises for an architecture it cannot use."""
    arch = found.arch
    if impl == "transformers":
        return f"The Transformers implementation of {arch} is not compatible with vLLM."
    if line.release < LOADER_07:
        return f"{arch} has no vLLM implementation and the Transformers implementation is not compatible with vLLM."
    if found.absent:
        return (
            f"Cannot find model module. '{arch}' is not a registered model in the Transformers library (only relevant "
            f"if the model is meant to be in Transformers) and 'AutoModel' is not present in the model config's "
            f"'auto_map' (relevant if the model is custom)."
        )
    return (
        f"{arch} has no vLLM implementation and the Transformers implementation is not compatible with vLLM. "
        f"Try setting VLLM_USE_V1=0."
    )


def load_refusal(found: Look, line: VersionLine, rt: ReleaseTransformers, impl: str) -> Outcome:
    arch = found.arch
    said = load_said(found, line, impl)
    near = nearest(arch, line)
    elsewhere = registering_release(arch, line)
    return Outcome(
        "error",
        f"{said} (vLLM {line.newest} builds the engine config, then fails when the model loads: "
        f"{found.describe(line, rt)}"
        + (f"; nearest registered: {', '.join(near)}" if near else "")
        + (f"; vLLM {elsewhere} registers {arch}" if elsewhere else "")
        + ")",
        {"vllm_version": elsewhere} if elsewhere else None,
        "engine_args.model_impl" if impl == "transformers" else ARCH_FIELD,
    )
