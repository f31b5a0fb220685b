"""Launches in shell scripts: each simple command that runs ``vllm serve`` or ``python -m
vllm.entrypoints.openai.api_server`` (behind ``exec``, ``nohup``, ``env``, ``VAR=x`` prefixes, ``sh -c '…'``),
its words expanded as the shell would from the assignments and ``export``s earlier in the script
(``$X``, ``${X}``, ``${X:-default}``, ``${X-default}``, ``${X:=default}``, ``${X:+alt}``, unquoted values split into
words). What the script cannot say here — a variable it never sets, ``$1``, ``$(command)`` — is a located problem;
``"$@"`` (arguments added when the script runs) is a located note."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from .found import FoundLaunch, Span, Word
from .shellwords import Command, Piece, Positions, ShellSyntaxError, ShellWord, read_commands

_KEYWORDS = {"if", "then", "else", "elif", "do", "while", "until", "!", "{", "time", "fi", "done", "}"}
_SKIP_COMMANDS = {"for", "case", "select", "function", "esac", "in"}
_WRAPPERS = {"exec", "nohup", "command", "setsid", "time", "builtin"}
_PYTHON = re.compile(r"python(\d(\.\d{1,2})?)?")
_PY_OPTS_WITH_VALUE = {"-X", "-W"}
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)
VLLM_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main")
MAX_SH_C_DEPTH = 2


class Unknown(Exception):
    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset


@dataclass
class _Scope:
    """What the script has set so far: name → value (None: set to something not known here, e.g. $(…))."""

    vars: dict[str, str | None] = field(default_factory=dict)
    exported: set[str] = field(default_factory=set)


class _Script:
    def __init__(self, text: str, file: str, span_of: Callable[[int], Span], kind: str) -> None:
        self.text = text
        self.file = file
        self.span_of = span_of
        self.kind = kind
        self.found: list[FoundLaunch] = []

    # --------------------------------------------------------------------------------------------- expansion
    def value(self, pieces: tuple[Piece, ...] | list[Piece], scope: _Scope) -> str:
        """The pieces as one string (an assignment's value: no field splitting)."""
        return "".join(self.piece(p, scope) for p in pieces)

    def piece(self, p: Piece, scope: _Scope) -> str:
        if p.kind == "lit":
            return p.text
        if p.kind == "cmd":
            raise Unknown(
                p.offset, f"{_short(p.text)} runs a command when the script runs; its output is not known here"
            )
        name = p.text
        if name in ("@", "*"):
            return ""
        if not (name[:1].isalpha() or name[:1] == "_"):
            raise Unknown(p.offset, f"${name} is set when the script runs; it is not known here")
        has = name in scope.vars
        val = scope.vars.get(name)
        op = p.op
        if op in (":-", "-", ":=", "="):
            use_default = not has or (op.startswith(":") and val == "")
            if use_default:
                out = self.value(p.default, scope)
                if op.endswith("="):
                    scope.vars[name] = out
                return out
        elif op in (":+", "+"):
            if has and val is None:
                raise Unknown(p.offset, f"${name} is set from something not known here")
            return self.value(p.default, scope) if has and (op == "+" or val) else ""
        if not has:
            raise Unknown(p.offset, f"${name} is not set in the script (it comes from the environment at run time)")
        if val is None:
            raise Unknown(p.offset, f"${name} is set from something not known here (a command's output)")
        return val

    def words(self, word: ShellWord, scope: _Scope, fl: FoundLaunch) -> list[Word]:
        """A word after expansion and field splitting, each with the place it starts."""
        fields: list[Word] = []
        cur: list[str] = []
        exists = False
        at = word.offset

        def finish() -> None:
            nonlocal cur, exists
            if exists:
                fields.append(Word("".join(cur), self.span_of(at)))
            cur, exists = [], False

        for p in word.pieces:
            if p.kind == "var" and p.text in ("@", "*"):
                fl.notes.append(
                    (
                        self.span_of(p.offset),
                        f"${p.text}: the script's own arguments are added when it runs; not checked",
                    )
                )
                continue
            try:
                text = self.piece(p, scope)
            except Unknown as u:
                fl.problems.append((self.span_of(u.offset), str(u)))
                text = self.source(p)
                if not exists:
                    at = word.offset if not fields else p.offset
                cur.append(text)
                exists = True
                continue
            if p.kind == "lit" or p.quoted:
                if not exists:
                    at = word.offset if not fields else p.offset
                cur.append(text)
                exists = True
                continue
            if not text:
                continue
            if text[0].isspace():
                finish()
            for k, part in enumerate(text.split()):
                if k:
                    finish()
                if not exists:
                    at = word.offset if not fields else p.offset
                cur.append(part)
                exists = True
            if text[-1].isspace():
                finish()
        finish()
        return fields

    def source(self, p: Piece) -> str:
        if p.kind == "var":
            return "${" + p.text + p.op + "…}" if p.op else "$" + p.text
        return p.text

    # ---------------------------------------------------------------------------------------------- commands
    def run(self, commands: list[Command], scope: _Scope, depth: int = 0) -> None:
        for cmd in commands:
            self.command(cmd, scope, depth)

    def command(self, cmd: Command, scope: _Scope, depth: int) -> None:
        words = list(cmd.words)
        while words and words[0].literal in _KEYWORDS:
            words = words[1:]
        if not words or words[0].literal in _SKIP_COMMANDS:
            return
        prefix: list[tuple[str, tuple[Piece, ...]]] = []
        while words:
            pair = words[0].assignment
            if pair is None:
                break
            prefix.append((pair[0], tuple(pair[1])))
            words = words[1:]
        if not words:
            for name, value in prefix:
                scope.vars[name] = self._known(value, scope)
            return
        head = words[0].literal
        if head in ("export", "declare", "typeset", "local", "readonly"):
            for w in words[1:]:
                a = w.assignment
                if a:
                    scope.vars[a[0]] = self._known(tuple(a[1]), scope)
                    if head == "export" or head != "local":
                        scope.exported.add(a[0])
                elif w.literal and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", w.literal):
                    scope.exported.add(w.literal)
            return
        if head == "unset":
            for w in words[1:]:
                scope.vars.pop(w.literal or "", None)
            return
        env = {k: v for k, v in scope.vars.items() if k in scope.exported and v is not None}
        for name, value in prefix:
            v = self._known(value, scope)
            if v is not None:
                env[name] = v
        i = self._unwrap(words, env)
        if i is None:
            return
        self.launch(cmd, words, i, scope, env, depth)

    def _known(self, pieces: tuple[Piece, ...], scope: _Scope) -> str | None:
        try:
            return self.value(pieces, scope)
        except Unknown:
            return None

    def _unwrap(self, words: list[ShellWord], env: dict[str, str]) -> int | None:
        """The index of the command behind exec / nohup / env … (None when it is none of ours)."""
        i = 0
        while i < len(words):
            head = words[i].literal
            if head in _WRAPPERS:
                i += 1
                while i < len(words) and (words[i].literal or "").startswith("-"):
                    i += 2 if words[i].literal == "-a" else 1
            elif head == "env":
                i += 1
                while i < len(words):
                    w = words[i]
                    a = w.assignment
                    if a and all(p.kind == "lit" for p in a[1]):
                        env[a[0]] = "".join(p.text for p in a[1])
                        i += 1
                    elif w.literal in ("-i", "--ignore-environment"):
                        env.clear()
                        i += 1
                    elif w.literal in ("-u", "--unset") and i + 1 < len(words):
                        env.pop(words[i + 1].literal or "", None)
                        i += 2
                    else:
                        break
            else:
                return i
        return None

    def launch(
        self, cmd: Command, words: list[ShellWord], i: int, scope: _Scope, env: dict[str, str], depth: int
    ) -> None:
        prog = os.path.basename(words[i].literal or "")
        nxt = words[i + 1].literal if i + 1 < len(words) else None
        if prog in ("sh", "bash", "dash", "zsh") and nxt == "-c" and i + 2 < len(words) and depth < MAX_SH_C_DEPTH:
            self.sh_c(words[i + 2], scope, depth)
            return
        keep: list[int]
        if prog == "vllm" and nxt == "serve":
            keep = list(range(i, len(words)))
        elif _PYTHON.fullmatch(prog):
            j = i + 1
            while j < len(words) and (words[j].literal or "").startswith("-") and words[j].literal != "-m":
                j += 2 if words[j].literal in _PY_OPTS_WITH_VALUE else 1
            if j + 1 >= len(words) or words[j].literal != "-m" or words[j + 1].literal not in VLLM_MODULES:
                return
            keep = [i, *range(j, len(words))]  # python's own options (-u) are not the server's
        else:
            return
        fl = FoundLaunch(kind=self.kind, at=self.span_of(cmd.words[0].offset), words=[], env=dict(env))
        for k in keep:
            fl.words += self.words(words[k], scope, fl)
        self.found.append(fl)

    def sh_c(self, word: ShellWord, scope: _Scope, depth: int) -> None:
        """``sh -c 'script'``: the script read in place when it is one quoted literal (its places are then the
        file's); otherwise as its own text, placed at the word."""
        if len(word.pieces) == 1 and word.pieces[0].kind == "lit" and word.pieces[0].quoted:
            p = word.pieces[0]
            start = p.offset + 1
            if self.text[start : start + len(p.text)] == p.text:
                self.run(read_commands(self.text, start, start + len(p.text)), _child(scope), depth + 1)
                return
        try:
            inner = self.value(tuple(word.pieces), scope)
        except Unknown:
            return  # a script that is not known here: not a launch this reader can see
        sub = _Script(inner, self.file, lambda _o: self.span_of(word.offset), self.kind)
        sub.run(read_commands(inner), _child(scope), depth + 1)
        self.found += sub.found


def launch_start(words: list[str]) -> tuple[int, list[int]] | None:
    """For an exec-form argv (no shell): (index of the program, the indexes to keep) when it runs vLLM's server
    behind exec / nohup / env VAR=x, else None."""
    i = 0
    while i < len(words):
        if words[i] in _WRAPPERS:
            i += 1
        elif words[i] == "env":
            i += 1
            while i < len(words) and _ASSIGNMENT.fullmatch(words[i]):
                i += 1
        else:
            break
    if i >= len(words):
        return None
    prog = os.path.basename(words[i])
    if prog == "vllm" and words[i + 1 : i + 2] == ["serve"]:
        return i, list(range(i, len(words)))
    if _PYTHON.fullmatch(prog):
        j = i + 1
        while j < len(words) and words[j].startswith("-") and words[j] != "-m":
            j += 2 if words[j] in _PY_OPTS_WITH_VALUE else 1
        if j + 1 < len(words) and words[j] == "-m" and words[j + 1] in VLLM_MODULES:
            return i, [i, *range(j, len(words))]
    return None


def _child(scope: _Scope) -> _Scope:
    """``sh -c`` runs a new shell: it sees only the exported variables."""
    return _Scope({k: v for k, v in scope.vars.items() if k in scope.exported}, set(scope.exported))


def _short(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "…"


def find_launches(
    text: str,
    file: str,
    *,
    kind: str = "shell",
    env: dict[str, str] | None = None,
    start: int = 0,
    end: int | None = None,
    span_of: Callable[[int], Span] | None = None,
) -> list[FoundLaunch]:
    """The launches in a shell script (or in ``text[start:end]``). ``env``: variables set before the script runs
    (a Dockerfile's ENV), exported. ``span_of``: file offset → Span (default: the text's own lines and columns).
    Raises ShellSyntaxError (with the offset) for a script the reader cannot follow."""
    if span_of is None:
        pos = Positions(text)

        def span_of(offset: int) -> Span:
            line, col = pos.at(offset)
            return Span(file, line, col)

    script = _Script(text, file, span_of, kind)
    scope = _Scope(dict(env or {}), set(env or {}))
    script.run(read_commands(text, start, end), scope)
    return script.found


class ShellReadError(ValueError):
    def __init__(self, message: str, at: Span) -> None:
        super().__init__(f"{at}: {message}")
        self.at = at
        self.reason = message


def read_script(text: str, file: str, *, kind: str = "shell", env: dict[str, str] | None = None) -> list[FoundLaunch]:
    """``find_launches`` with a syntax error reported at its place (ShellReadError)."""
    try:
        return find_launches(text, file, kind=kind, env=env)
    except ShellSyntaxError as e:
        line, col = Positions(text).at(e.offset)
        raise ShellReadError(str(e), Span(file, line, col)) from None
