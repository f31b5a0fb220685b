"""Launches in shell scripts: each simple command that runs vLLM's server (entrypoints.py says which: ``vllm serve``,
``python -m vllm.entrypoints.openai.api_server``) behind ``VAR=x`` prefixes, ``sh -c '…'`` and the wrapper programs
entrypoints.py follows (``exec``, ``nohup``, ``env``, ``sudo``, ``timeout``, ``numactl``, ``taskset``, ``nice``,
``stdbuf``, ``chrt``, ``setsid``, ``uv run`` …, each with its own options),
its words expanded as the shell would from the assignments and ``export``s earlier in the script
(``$X``, ``${X}``, ``${X:-default}``, ``${X-default}``, ``${X:=default}``, ``${X:+alt}``, unquoted values split into
words). What the script cannot say here — a variable it never sets, ``$1``, ``$(command)`` — is a located problem;
``"$@"`` (arguments added when the script runs) is a located note."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .entrypoints import SERVER_NAMED, apply_env, is_vllm_program, server_at, server_words, shell_script_index, unwrap
from .found import MAX_LAUNCHES, FoundLaunch, SourceError, Span, Word, too_many_launches
from .shellwords import Command, Piece, Positions, ShellSyntaxError, ShellWord, as_written, read_commands

_KEYWORDS = {"if", "then", "else", "elif", "do", "while", "until", "!", "{", "fi", "done", "}"}
_SKIP_COMMANDS = {"for", "case", "select", "function", "esac", "in"}
MAX_SH_C_DEPTH = 2


class Unknown(Exception):
    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset


@dataclass
class _Scope:
    """What the script has set so far: name → value (None: set to something not known here, e.g. $(…); ``why``
    says what, for a variable set before the script ran)."""

    vars: dict[str, str | None] = field(default_factory=dict)
    exported: set[str] = field(default_factory=set)
    why: dict[str, str] = field(default_factory=dict)


class _Script:
    def __init__(self, text: str, file: str, span_of: Callable[[int], Span], kind: str) -> None:
        self.text = text
        self.file = file
        self.span_of = span_of
        self.kind = kind
        self.found: list[FoundLaunch] = []

    def add(self, fl: FoundLaunch) -> None:
        """One more launch: the script is refused at the first one over MAX_LAUNCHES (bounded work)."""
        if len(self.found) >= MAX_LAUNCHES:
            raise too_many_launches(fl.at)
        self.found.append(fl)

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
            why = scope.why.get(name, "is set from something not known here (a command's output)")
            raise Unknown(p.offset, f"${name} {why}")
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
        return as_written(p)

    # ---------------------------------------------------------------------------------------------- commands
    def run(self, commands: list[Command], scope: _Scope, depth: int = 0) -> None:
        for cmd in commands:
            self.command(cmd, scope, depth)

    def command(self, cmd: Command, scope: _Scope, depth: int) -> None:
        words = list(cmd.words)
        # keywords in front of a command; `time` is a wrapper (`time -p cmd`) unless a keyword follows (`time { …; }`)
        while words and (
            words[0].literal in _KEYWORDS
            or (words[0].literal == "time" and words[1:2] and words[1].literal in _KEYWORDS)
        ):
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
        got = unwrap([w.literal for w in words], [a[0] if (a := w.assignment) else None for w in words])
        env = apply_env(got.env, env, lambda k: self._assigned_value(words[k], scope))
        if got.problem is not None:
            self.wrapper_problem(cmd, words, got.problem, env)
        elif got.index is not None:
            self.launch(cmd, words, got.index, scope, env, depth)

    def _known(self, pieces: tuple[Piece, ...], scope: _Scope) -> str | None:
        try:
            return self.value(pieces, scope)
        except Unknown:
            return None

    def _assigned_value(self, word: ShellWord, scope: _Scope) -> str | None:
        a = word.assignment
        return self._known(tuple(a[1]), scope) if a is not None else None

    def wrapper_problem(
        self, cmd: Command, words: list[ShellWord], problem: tuple[int, str], env: dict[str, str]
    ) -> None:
        """A wrapper's argument this reader cannot follow, in front of vLLM's server: the launch, failed closed at
        the argument (a command that starts no server is none of ours)."""
        index, message = problem
        at = server_at([w.literal for w in words], index)
        if at is None:
            return
        fl = FoundLaunch(kind=self.kind, at=self.span_of(cmd.words[0].offset), words=[], env=dict(env))
        fl.words = [Word(w.written, self.span_of(w.offset)) for w in words[at:]]
        fl.problems.append((self.span_of(words[index].offset), message))
        self.add(fl)

    def launch(
        self, cmd: Command, words: list[ShellWord], i: int, scope: _Scope, env: dict[str, str], depth: int
    ) -> None:
        literals = [w.literal for w in words[i:]]
        if literals[0] == "eval" or literals[0] is None:
            self.unfollowed(cmd, words[i:], scope)
            return
        script = shell_script_index(literals)
        if script is not None:
            if depth < MAX_SH_C_DEPTH:
                self.sh_c(words[i + script], scope, depth)
            return
        found = server_words(literals)
        if found is None:
            return
        keep = [i + k for k in found]
        fl = FoundLaunch(kind=self.kind, at=self.span_of(cmd.words[0].offset), words=[], env=dict(env))
        for k in keep:
            fl.words += self.words(words[k], scope, fl)
        self.add(fl)

    def unfollowed(self, cmd: Command, words: list[ShellWord], scope: _Scope) -> None:
        """``eval …`` or a program named by an expansion (``$V serve …``): when it may start vLLM's server (the
        words name it, or the program's value is vLLM), a launch that fails closed at the command's first word."""
        head = words[0]
        try:
            program = posixpath.basename(self.value(tuple(head.pieces), scope).split(" ")[0])
        except Unknown:
            program = ""
        text = " ".join(w.written for w in words)
        if not (is_vllm_program(program) or SERVER_NAMED.search(text) or (words[1:2] and words[1].literal == "serve")):
            return
        why = (
            "eval runs its arguments as a new command line"
            if head.literal == "eval"
            else f"the program is {_short(head.written)}, a command named by a variable"
        )
        fl = FoundLaunch(kind=self.kind, at=self.span_of(cmd.words[0].offset), words=[])
        fl.problems.append((self.span_of(head.offset), f"{why}: not followed here; write the command itself"))
        self.add(fl)

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
        for fl in sub.found:
            self.add(fl)


def _child(scope: _Scope) -> _Scope:
    """``sh -c`` runs a new shell: it sees only the exported variables."""
    return _Scope({k: v for k, v in scope.vars.items() if k in scope.exported}, set(scope.exported), scope.why)


def _short(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "…"


def find_launches(
    text: str,
    file: str,
    *,
    kind: str = "shell",
    env: Mapping[str, str | None] | None = None,
    why: Mapping[str, str] | None = None,
    start: int = 0,
    end: int | None = None,
    span_of: Callable[[int], Span] | None = None,
) -> list[FoundLaunch]:
    """The launches in a shell script (or in ``text[start:end]``). ``env``: variables set before the script runs
    (a Dockerfile's ENV, a container's env), exported; None for one whose value is not in the file, ``why[name]``
    saying so. ``span_of``: file offset → Span (default: the text's own lines and columns).
    Raises ShellSyntaxError (with the offset) for a script the reader cannot follow."""
    if span_of is None:
        pos = Positions(text)

        def span_of(offset: int) -> Span:
            line, col = pos.at(offset)
            return Span(file, line, col)

    script = _Script(text, file, span_of, kind)
    scope = _Scope(dict(env or {}), set(env or {}), dict(why or {}))
    script.run(read_commands(text, start, end), scope)
    return script.found


def read_script(text: str, file: str, *, kind: str = "shell", env: dict[str, str] | None = None) -> list[FoundLaunch]:
    """``find_launches`` with a syntax error reported at its place (SourceError)."""
    try:
        return find_launches(text, file, kind=kind, env=env)
    except ShellSyntaxError as e:
        line, col = Positions(text).at(e.offset)
        raise SourceError(str(e), Span(file, line, col)) from None
