"""What the YAML readers share about a container's process: located strings, Kubernetes' ``$(VAR)`` and Compose's
``${VAR}`` expansion, a ``sh -c`` script split into words, and the vLLM entry points recognised in an argv.

A located string (``LStr``) keeps the source offset of each character, so a word split out of
``command: ["sh", "-c", "ray start …; vllm serve m --tensor-parallel-size 8"]`` is reported at the column of its first
character, and a value substituted for ``$(VAR)`` at the ``$`` that asked for it."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .found import Span, Word
from .yaml_load import Node, Source, char_offsets

# The vllm/vllm-openai image's ENTRYPOINT, which args are appended to. vLLM's docker/Dockerfile, target
# ``vllm-openai``: ``ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]`` in 2025 releases
# (e.g. vllm commit 0000977e, docker/Dockerfile, last lines), ``ENTRYPOINT ["vllm", "serve"]`` in current ones.
# Either takes ``vllm serve``'s options (the api_server module is what ``vllm serve`` runs), so args given to the
# image are read as ``vllm serve`` + args; a positional model is only accepted by the newer entry point.
VLLM_IMAGE = re.compile(
    r"^(?:(?:docker\.io|registry-1\.docker\.io|public\.ecr\.aws/[^/]+)/)?vllm/vllm-openai(?:[:@].*)?$"
)
SHELLS = {"sh", "bash", "dash", "ash", "zsh", "ksh"}
_PYTHON = re.compile(r"python(?:\d(?:\.\d+)?)?")
API_SERVER = "vllm.entrypoints.openai.api_server"
CLI_MAIN = "vllm.entrypoints.cli.main"
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

    def plain(self, keep: Callable[[str], bool] = lambda n: n.startswith(("VLLM_", "HF_"))) -> dict[str, str]:
        return {k: v.text for k, v in self.values.items() if v is not None and keep(k)}


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
class Tok:
    text: str
    off: int
    op: bool = False


def shell_words(s: LStr, env: Mapping[str, LStr | None], loc: Located) -> list[Tok]:
    """A ``sh -c`` script as POSIX shell words and control operators (``;``, ``&&``, ``||``, ``|``, ``&``, newline),
    quotes removed. ``$VAR`` / ``${VAR}`` take the container's value where the file sets one; any other expansion
    (``$(…)``, a variable the file does not set) is left as written and, inside the vLLM command, reported."""
    text, toks = s.text, []
    i, n = 0, len(text)
    cur: list[str] | None = None
    start = 0

    def flush() -> None:
        nonlocal cur
        if cur is not None:
            toks.append(Tok("".join(cur), s.off(start)))
            cur = None

    def begin(at: int) -> list[str]:
        nonlocal cur, start
        if cur is None:
            cur, start = [], at
        return cur

    while i < n:
        c = text[i]
        if c in " \t":
            flush()
            i += 1
        elif c == "\n" or c in ";&|()":
            flush()
            op = text[i : i + 2] if text[i : i + 2] in ("&&", "||", ";;") else ("\n" if c == "\n" else c)
            toks.append(Tok(op, s.off(i), op=True))
            i += len(op)
        elif c == "#" and cur is None:
            while i < n and text[i] != "\n":
                i += 1
        elif c == "\\":
            if text[i + 1 : i + 2] == "\n":
                i += 2
                continue
            begin(i).append(text[i + 1 : i + 2])
            i += 2
        elif c == "'":
            end = text.find("'", i + 1)
            end = n if end < 0 else end
            begin(i).append(text[i + 1 : end])
            i = end + 1
        elif c == '"':
            buf = begin(i)
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\" and text[i + 1 : i + 2] in ('"', "\\", "$", "`", "\n"):
                    buf.append("" if text[i + 1] == "\n" else text[i + 1])
                    i += 2
                elif text[i] == "$":
                    i = _dollar(text, i, buf, env, s, loc)
                else:
                    buf.append(text[i])
                    i += 1
            i += 1
        elif c == "$":
            i = _dollar(text, i, begin(i), env, s, loc)
        else:
            begin(i).append(c)
            i += 1
    flush()
    return toks


_SH_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def _dollar(text: str, i: int, buf: list[str], env: Mapping[str, LStr | None], s: LStr, loc: Located) -> int:
    m = _SH_VAR.match(text, i)
    if m is None:
        buf.append("$")
        return i + 1
    name = m.group(1) or m.group(2)
    val = env.get(name)
    if val is not None:
        buf.append(val.text)
    else:
        buf.append(m.group(0))
    return m.end()


def commands(toks: list[Tok]) -> list[list[Tok]]:
    """Simple commands: the words between control operators."""
    out: list[list[Tok]] = [[]]
    for t in toks:
        if t.op:
            if out[-1]:
                out.append([])
        else:
            out[-1].append(t)
    return [c for c in out if c]


_ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def vllm_words(words: list[Word]) -> tuple[list[Word], dict[str, str]] | None:
    """``vllm serve …`` for an argv that runs vLLM's server, with the variables set in front of it (``exec``,
    ``env``, ``nohup``, ``VAR=value`` prefixes dropped); None for any other program.

    ``vllm serve`` (any path to ``vllm``), ``python -m vllm.entrypoints.cli.main serve`` and ``python -m
    vllm.entrypoints.openai.api_server OPTIONS`` (rewritten as ``vllm serve OPTIONS``, the two made-up words
    without a place) are recognised."""
    env: dict[str, str] = {}
    i = 0
    while i < len(words):
        t = words[i].text
        if t in ("exec", "env", "nohup", "command"):
            i += 1
        elif _ASSIGN.match(t):
            name, _, val = t.partition("=")
            env[name] = val
            i += 1
        else:
            break
    rest = words[i:]
    if len(rest) >= 2 and posixpath.basename(rest[0].text) == "vllm" and rest[1].text == "serve":
        return [Word("vllm", rest[0].at), *rest[1:]], env
    if rest and _PYTHON.fullmatch(posixpath.basename(rest[0].text)):
        j = 1
        while j < len(rest) and rest[j].text.startswith("-") and rest[j].text != "-m":
            j += 1
        if j + 1 < len(rest) and rest[j].text == "-m":
            module = rest[j + 1].text
            if module == API_SERVER:
                return [Word("vllm"), Word("serve"), *rest[j + 2 :]], env
            if module == CLI_MAIN and j + 2 < len(rest) and rest[j + 2].text == "serve":
                return [Word("vllm"), *rest[j + 2 :]], env
    return None


def is_vllm_image(image: str | None) -> bool:
    return bool(image and VLLM_IMAGE.match(image.strip()))


def process_words(
    argv: list[LStr], env: Mapping[str, LStr | None], loc: Located, flavor: str = "kubernetes"
) -> list[tuple[list[Word], dict[str, str]]]:
    """The vLLM launches of a container's argv (exec form): the argv itself, or, for ``sh -c SCRIPT``, each simple
    command of the script that runs vLLM. A word that still holds a variable reference is a located problem."""
    if not argv:
        return []
    if posixpath.basename(argv[0].text) in SHELLS:
        script = _script(argv)
        if script is None:
            return []
        script = LStr(script.text.replace(ESCAPED, "$"), script.offs, script.start)
        found = []
        for cmd in commands(shell_words(script, env, loc)):
            hit = vllm_words([Word(t.text, loc.span(t.off)) for t in cmd])
            if hit:
                report_unexpanded(hit[0], loc, env, "shell")
                found.append(hit)
        return found
    hit = vllm_words([Word(a.text, loc.span(a.offs[0] if a.offs else a.start)) for a in argv])
    if not hit:
        return []
    report_unexpanded(hit[0], loc, env, flavor)
    return [(unescape(hit[0]), hit[1])]


def unescape(words: list[Word]) -> list[Word]:
    return [Word(w.text.replace(ESCAPED, "$"), w.at) if ESCAPED in w.text else w for w in words]


def _script(argv: list[LStr]) -> LStr | None:
    """The script of ``sh [-e…] -c SCRIPT``, or ``-lc`` / ``-ec`` combined options."""
    for k, a in enumerate(argv[1:], start=1):
        if a.text.startswith("-") and not a.text.startswith("--") and "c" in a.text[1:]:
            return argv[k + 1] if k + 1 < len(argv) else None
        if not a.text.startswith("-"):
            return None
    return None


_UNEXPANDED = re.compile(
    r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)|\$\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}|\$([A-Za-z_][A-Za-z0-9_]*)|\$\("
)
_WHY = {
    "shell": "is expanded by the shell at start-up from a value not in the file",
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
