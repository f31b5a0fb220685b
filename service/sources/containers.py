"""What the YAML readers share about a container's process: located strings, Kubernetes' ``$(VAR)`` and Compose's
``${VAR}`` expansion, and the launches of an exec-form argv (entrypoints.py says which argv starts vLLM's server;
a ``sh -c`` script is read by shell.py, as any shell script).

A located string (``LStr``) keeps the source offset of each character, so a word split out of
``command: ["sh", "-c", "ray start …; vllm serve m --tensor-parallel-size 8"]`` is reported at the column of its first
character, and a value substituted for ``$(VAR)`` at the ``$`` that asked for it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .entrypoints import launch_start, shell_script_index
from .found import SourceError, Span, Word
from .shellwords import ShellSyntaxError
from .yaml_load import Node, Source, char_offsets

UNSET = None  # an env value the file does not hold (valueFrom, a host variable)
# Kubernetes' ``$$``: a ``$`` no later step may read as a reference; it becomes ``$`` again in the final words
# (and before a shell reads a script, for which it is an ordinary ``$``).
ESCAPED = "\ue000"


@dataclass(slots=True)
class LStr:
    """A string and the source offset of each of its characters (``start``: where an empty string is)."""

    text: str
    offs: list[int]
    start: int

    @classmethod
    def of(cls, src: Source, node: Node) -> LStr:
        offs = char_offsets(src, node)
        text = node.text if node.kind == "scalar" else ""
        return cls(text, offs if offs is not None else [node.start] * len(text), node.start)

    @classmethod
    def made(cls, text: str, at: int) -> LStr:
        return cls(text, [at] * len(text), at)

    def off(self, i: int) -> int:
        return self.offs[i] if i < len(self.offs) else (self.offs[-1] if self.offs else self.start)


@dataclass(slots=True)
class Env:
    """A container's variables as the file sets them: name → located value, or UNSET (valueFrom, host)."""

    values: dict[str, LStr | None]

    def plain(self) -> dict[str, str]:
        return server_env({k: v.text if v is not None else None for k, v in self.values.items()})


def server_env(env: Mapping[str, str | None]) -> dict[str, str]:
    """The variables that concern the check (vLLM's and Hugging Face's) with the values the file gives them."""
    return {k: v for k, v in env.items() if v is not None and k.startswith(("VLLM_", "HF_"))}


class Located:
    """Offsets → Spans for one file; problems gathered while reading one launch."""

    def __init__(self, src: Source) -> None:
        self.src = src
        self.problems: list[tuple[Span, str]] = []

    def span(self, off: int) -> Span:
        line, col = self.src.at(off)
        return Span(self.src.file, line, col)

    def node_span(self, node: Node) -> Span:
        return Span(self.src.file, node.line, node.col)

    def problem(self, off: int, message: str) -> None:
        self.problems.append((self.span(off), message))


def k8s_expand(s: LStr, env: Mapping[str, LStr | None]) -> LStr:
    """Kubernetes' variable references (k8s.io/kubernetes third_party/forked/golang/expansion/expand.go, the rules
    the API documents for command, args and env values): ``$(VAR)`` is the value of a variable defined earlier in
    the container's env; ``$$`` is ``$`` (so ``$$(VAR)`` is the literal ``$(VAR)``); a reference that cannot be
    resolved is left as written, and so is one set by ``valueFrom`` (its value is not in the file): a word of the
    vLLM command that still holds one is reported by ``process_words``."""
    text, out, offs = s.text, [], []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "$" or i + 1 >= len(text):
            out.append(c)
            offs.append(s.off(i))
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append(ESCAPED)
            offs.append(s.off(i))
            i += 2
            continue
        if nxt == "(":
            close = text.find(")", i + 2)
            if close >= 0:
                name = text[i + 2 : close]
                val = env.get(name)
                if val is not None:
                    out.append(val.text)
                    offs.extend([s.off(i)] * len(val.text))
                    i = close + 1
                    continue
                out.append(text[i : close + 1])  # unresolved: left as written
                offs.extend(s.off(j) for j in range(i, close + 1))
                i = close + 1
                continue
        out.append(c)
        offs.append(s.off(i))
        i += 1
    return LStr("".join(out), offs, s.start)


_COMPOSE_VAR = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def compose_interpolate(s: LStr) -> LStr:
    """Compose's interpolation (compose-spec interpolation.md): ``$$`` is ``$``; ``${VAR:-default}`` /
    ``${VAR-default}`` take the default (the host's environment is not in the file); ``${VAR}`` / ``$VAR`` without
    one come from the host at ``docker compose up``: left as written (reported when a vLLM word holds one)."""
    out: list[str] = []
    offs: list[int] = []
    pos = 0
    for m in _COMPOSE_VAR.finditer(s.text):
        out.append(s.text[pos : m.start()])
        offs.extend(s.off(j) for j in range(pos, m.start()))
        pos = m.end()
        if m.group(0) == "$$":
            out.append("$")
            offs.append(s.off(m.start()))
        elif m.group(2) in (":-", "-"):
            out.append(m.group(3))
            offs.extend(s.off(m.start(3) + j) for j in range(len(m.group(3))))
        else:
            out.append(m.group(0))
            offs.extend(s.off(j) for j in range(m.start(), m.end()))
    out.append(s.text[pos:])
    offs.extend(s.off(j) for j in range(pos, len(s.text)))
    return LStr("".join(out), offs, s.start)


@dataclass(slots=True)
class Hit:
    """One launch in a container's process: its words, the variables set in front of it (``env VAR=x``, a script's
    exports), and what the script reader could not read (located)."""

    words: list[Word]
    env: dict[str, str]
    problems: list[tuple[Span, str]] = field(default_factory=list)
    notes: list[tuple[Span, str]] = field(default_factory=list)
    complete: bool = False  # a wrapper cleared the environment (env -i, sudo): ``env`` is all the process gets


def process_words(
    argv: list[LStr], env: Mapping[str, LStr | None], loc: Located, flavor: str = "kubernetes"
) -> list[Hit]:
    """The vLLM launches of a container's argv (exec form): the argv itself, or, for ``sh -c SCRIPT``, each command
    of the script that runs vLLM. A word of the argv that still holds a variable reference is a located problem."""
    if not argv:
        return []
    texts = [a.text for a in argv]
    script = shell_script_index(texts)
    if script is not None:
        return _script_launches(argv[script], env, loc, flavor)
    found = launch_start(texts)  # its env: the variables the wrappers set
    if found is None:
        return []
    words = [Word(argv[k].text, loc.span(argv[k].off(0))) for k in found.keep]
    report_unexpanded(words, loc, env, flavor)
    hit = Hit(unescape(words), found.env, complete=found.cleared)
    if found.cleared:
        hit.env = found.env_from({k: v.text for k, v in env.items() if v is not None}, texts)
    if found.problem is not None:
        k, message = found.problem
        hit.problems.append((loc.span(argv[k].off(0)), message))
    return [hit]


def _script_launches(script: LStr, env: Mapping[str, LStr | None], loc: Located, flavor: str) -> list[Hit]:
    """``sh -c SCRIPT``: the script read by shell.py with the container's variables exported, each word placed
    through the script's located characters."""
    from .shell import find_launches

    values: dict[str, str | None] = {k: v.text.replace(ESCAPED, "$") if v is not None else None for k, v in env.items()}
    why = {k: _UNSET_WHY[flavor].format(name=k) for k, v in env.items() if v is None}
    try:
        found = find_launches(
            script.text.replace(ESCAPED, "$"),
            loc.src.file,
            env=values,
            why=why,
            span_of=lambda off: loc.span(script.off(off)),
        )
    except ShellSyntaxError as e:
        at = loc.span(script.off(e.offset))
        raise SourceError(f"the container's `sh -c` script cannot be read: {e}", at) from None
    return [Hit(f.words, f.env, f.problems, f.notes) for f in found]


_UNSET_WHY = {
    "kubernetes": "is set by valueFrom (a secret, config map or field): its value is not in the file",
    "compose": "is taken from the host's environment at `docker compose up`: its value is not in the file",
}


def unescape(words: list[Word]) -> list[Word]:
    return [Word(w.text.replace(ESCAPED, "$"), w.at) if ESCAPED in w.text else w for w in words]


_UNEXPANDED = re.compile(
    r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)|\$\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}|\$([A-Za-z_][A-Za-z0-9_]*)|\$\("
)
_WHY = {
    "kubernetes": "is not defined in the container's env: Kubernetes passes it as written",
    "compose": "is set from the host's environment at `docker compose up`: not in the file",
}


def report_unexpanded(words: list[Word], loc: Located, env: Mapping[str, LStr | None], flavor: str) -> None:
    for w in words:
        m = _UNEXPANDED.search(w.text)
        if m is None or w.at is None:
            continue
        name = m.group(1) or m.group(2) or m.group(3)
        if name in env and env[name] is None:
            why = f"{name} is set by valueFrom (a secret, config map or field): its value is not in the file"
        else:
            why = _WHY[flavor]
        loc.problems.append((w.at, f"{m.group(0)}: {why}"))
