"""Shell words with their places: the part of POSIX shell (bash) syntax a launch script uses, read in one linear
pass so every word keeps the line and column where it starts.

Why not bashlex: it refuses whole scripts over one ``case`` statement (NotImplementedError: type = {pattern}), which
entrypoint scripts use for their argument handling; shlex keeps no positions. This reader knows quoting ('…', "…",
$'…', backslashes), line continuations, comments, operators (; & && || | ( ) ;;), redirections (dropped, with their
target; here-document bodies skipped), and keeps parameter expansions (``$X``, ``${X}``, ``${X:-default}``,
``${X-default}``, ``${X:=default}``) and command substitutions as pieces for the caller to expand. Anything it
cannot follow is a located ``ShellSyntaxError``, never a guess.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field

MAX_WORDS = 200_000
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!])(?:(:?[-=+?])(.*))?", re.DOTALL)
_SPECIAL = set("@*#?$!0123456789-")


class ShellSyntaxError(ValueError):
    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


@dataclass(frozen=True, slots=True)
class Piece:
    """Part of a word. ``kind``: ``lit`` (text), ``var`` (``name``, ``op`` such as ':-' or '', ``default`` the
    pieces of the word after the operator), ``cmd`` (a command substitution; ``text`` is its source). ``quoted``:
    inside double quotes (no field splitting); ``offset``: where it starts in the file."""

    kind: str
    text: str
    quoted: bool
    offset: int
    op: str = ""
    default: tuple[Piece, ...] = ()
    braced: bool = False  # ``${X}`` rather than ``$X``


def as_written(p: Piece) -> str:
    """A piece as the script spells it (quotes aside): a literal's text, ``$X`` / ``${X:-default}``, a command
    substitution's source."""
    if p.kind != "var":
        return p.text
    if not p.op:
        return "${" + p.text + "}" if p.braced else "$" + p.text
    return "${" + p.text + p.op + "".join(as_written(d) for d in p.default) + "}"


@dataclass(slots=True)
class ShellWord:
    pieces: list[Piece]
    offset: int

    @property
    def literal(self) -> str | None:
        """The word's text when it has no expansion."""
        if all(p.kind == "lit" for p in self.pieces):
            return "".join(p.text for p in self.pieces)
        return None

    @property
    def written(self) -> str:
        """The word with its quotes removed and its expansions as written (a command line that no shell runs,
        e.g. a compose ``command:`` string, which Compose splits into words without expanding them)."""
        return "".join(as_written(p) for p in self.pieces)

    @property
    def assignment(self) -> tuple[str, list[Piece]] | None:
        """``NAME=value`` (the name unquoted): the name and the value's pieces."""
        first = self.pieces[0] if self.pieces else None
        if first is None or first.kind != "lit" or first.quoted or "=" not in first.text:
            return None
        name, _, rest = first.text.partition("=")
        if not _NAME.fullmatch(name) or (first.offset, first.text) == (-1, ""):
            return None
        value = ([Piece("lit", rest, False, first.offset + len(name) + 1)] if rest else []) + self.pieces[1:]
        return name, value


@dataclass(slots=True)
class Command:
    """A simple command: its words (redirections removed), and the operator that ended it."""

    words: list[ShellWord] = field(default_factory=list)
    end: str = ""


class Positions:
    """File offsets to 1-based (line, column)."""

    def __init__(self, text: str) -> None:
        self._starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def at(self, offset: int) -> tuple[int, int]:
        line = bisect_right(self._starts, offset) - 1
        return line + 1, offset - self._starts[line] + 1


_REDIRECT = re.compile(r"&>>?|<<<|<<-?|<>|>>|>&|<&|>\||[<>]")
MAX_DEPTH = 8
_OPERATORS = ("&&", "||", ";;", "|&", ";", "&", "|", "(", ")")


class _Reader:
    def __init__(self, text: str, start: int = 0, end: int | None = None, depth: int = 0) -> None:
        self.s = text
        self.n = len(text) if end is None else end
        self.i = start
        self.depth = depth
        self.commands: list[Command] = []
        self.cmd = Command()
        self.heredocs: list[tuple[str, bool]] = []
        self.redirect_target = False
        self.count = 0

    # -------------------------------------------------------------------------------------------------- commands
    def run(self) -> list[Command]:
        while self.i < self.n:
            c = self.s[self.i]
            if c in " \t\r":
                self.i += 1
            elif c == "\\" and self.s.startswith("\\\n", self.i):
                self.i += 2
            elif c == "\n":
                self.i += 1
                self._end("\n")
                if self.heredocs:
                    self._skip_heredocs()
            elif c == "#":
                j = self.s.find("\n", self.i, self.n)
                self.i = self.n if j < 0 else j
            elif c in "<>" or (c == "&" and self.s.startswith("&>", self.i)):
                self._redirection()
            elif c in ";&|()":
                op = next(o for o in _OPERATORS if self.s.startswith(o, self.i))
                self.i += len(op)
                self._end(op)
            else:
                word = self._word()
                if self.redirect_target:
                    self.redirect_target = False
                elif word.pieces:
                    self.cmd.words.append(word)
        self._end("")
        return self.commands

    def _end(self, op: str) -> None:
        if self.redirect_target:
            raise ShellSyntaxError("a redirection has no target", self.i)
        if self.cmd.words:
            self.cmd.end = op
            self.commands.append(self.cmd)
        self.cmd = Command()

    def _redirection(self) -> None:
        m = _REDIRECT.match(self.s, self.i)
        assert m is not None
        op = m.group(0)
        self.i = m.end()
        if op in ("<<", "<<-"):
            while self.i < self.n and self.s[self.i] in " \t":
                self.i += 1
            word = self._word()
            delim = "".join(p.text for p in word.pieces)
            self.heredocs.append((delim, op == "<<-"))
            return
        self.redirect_target = True

    def _skip_heredocs(self) -> None:
        for delim, strip in self.heredocs:
            while self.i < self.n:
                j = self.s.find("\n", self.i, self.n)
                end = self.n if j < 0 else j
                line = self.s[self.i : end]
                self.i = end + 1 if j >= 0 else self.n
                if (line.lstrip("\t") if strip else line) == delim:
                    break
        self.heredocs = []

    # ----------------------------------------------------------------------------------------------------- words
    def _word(self) -> ShellWord:
        """One word from ``self.i``; digits right before a redirection are its file descriptor (dropped)."""
        start = self.i
        pieces: list[Piece] = []
        buf: list[str] = []
        buf_at = start

        def flush() -> None:
            nonlocal buf, buf_at
            if buf:
                pieces.append(Piece("lit", "".join(buf), False, buf_at))
                buf = []

        while self.i < self.n:
            c = self.s[self.i]
            if c in " \t\r\n;&|()":
                break
            if c in "<>":
                text = "".join(buf)
                if not pieces and text.isdigit():  # 2>&1: the descriptor, not a word
                    return ShellWord([], start)
                break
            if not buf:
                buf_at = self.i
            if c == "\\":
                if self.s.startswith("\\\n", self.i):
                    self.i += 2
                    continue
                if self.i + 1 < self.n:
                    buf.append(self.s[self.i + 1])
                self.i += 2
            elif c == "'":
                flush()
                j = self.s.find("'", self.i + 1, self.n)
                if j < 0:
                    raise ShellSyntaxError("a single quote is never closed", self.i)
                pieces.append(Piece("lit", self.s[self.i + 1 : j], True, self.i))
                self.i = j + 1
            elif c == '"':
                flush()
                pieces += self._double_quoted()
            elif c == "$" or c == "`":
                piece = self._dollar(quoted=False)
                if piece is None:
                    buf.append("$")
                    self.i += 1
                else:
                    flush()
                    pieces.append(piece)
            else:
                buf.append(c)
                self.i += 1
        flush()
        self.count += 1
        if self.count > MAX_WORDS:
            raise ShellSyntaxError(f"the script has more than {MAX_WORDS} words", start)
        return ShellWord(pieces, start)

    def _double_quoted(self) -> list[Piece]:
        opened = self.i
        self.i += 1
        pieces: list[Piece] = []
        buf: list[str] = []
        buf_at = self.i
        while True:
            if self.i >= self.n:
                raise ShellSyntaxError("a double quote is never closed", opened)
            c = self.s[self.i]
            if c == '"':
                self.i += 1
                break
            if not buf:
                buf_at = self.i
            if c == "\\" and self.i + 1 < self.n and self.s[self.i + 1] in '$`"\\\n':
                if self.s[self.i + 1] != "\n":
                    buf.append(self.s[self.i + 1])
                self.i += 2
            elif c in "$`":
                piece = self._dollar(quoted=True)
                if piece is None:
                    buf.append("$")
                    self.i += 1
                else:
                    if buf:
                        pieces.append(Piece("lit", "".join(buf), True, buf_at))
                        buf = []
                    pieces.append(piece)
            else:
                buf.append(c)
                self.i += 1
        if buf or not pieces:
            pieces.append(Piece("lit", "".join(buf), True, buf_at if buf else opened))
        return pieces

    def _dollar(self, quoted: bool) -> Piece | None:
        at = self.i
        s = self.s
        if s[at] == "`":
            j = at + 1
            while j < self.n and s[j] != "`":
                j += 2 if s[j] == "\\" else 1
            if j >= self.n:
                raise ShellSyntaxError("a backquote is never closed", at)
            self.i = j + 1
            return Piece("cmd", s[at : j + 1], quoted, at)
        nxt = s[at + 1 : at + 2] if at + 1 < self.n else ""
        if nxt == "(":
            j = self._closing(at + 1, "(", ")")
            self.i = j + 1
            return Piece("cmd", s[at : j + 1], quoted, at)
        if nxt == "{":
            j = self._closing(at + 1, "{", "}")
            self.i = j + 1
            return self._braced(s[at + 2 : j], quoted, at)
        if nxt == "'" and not quoted:
            j = at + 2
            out: list[str] = []
            while j < self.n and s[j] != "'":
                if s[j] == "\\" and j + 1 < self.n:
                    out.append({"n": "\n", "t": "\t", "\\": "\\", "'": "'", '"': '"'}.get(s[j + 1], "\\" + s[j + 1]))
                    j += 2
                else:
                    out.append(s[j])
                    j += 1
            if j >= self.n:
                raise ShellSyntaxError("a $'…' quote is never closed", at)
            self.i = j + 1
            return Piece("lit", "".join(out), True, at)
        m = _NAME.match(s, at + 1, self.n)
        if m:
            self.i = m.end()
            return Piece("var", m.group(0), quoted, at)
        if nxt and nxt in _SPECIAL:
            self.i = at + 2
            return Piece("var", nxt, quoted, at)
        return None

    def _closing(self, start: int, open_c: str, close_c: str) -> int:
        """The index of the bracket closing the one at ``start`` (quotes inside skipped)."""
        depth = 0
        j = start
        s = self.s
        while j < self.n:
            c = s[j]
            if c == "\\":
                j += 2
                continue
            if c == "'" and open_c == "(":
                k = s.find("'", j + 1, self.n)
                if k < 0:
                    break
                j = k + 1
                continue
            if c == open_c:
                depth += 1
            elif c == close_c:
                depth -= 1
                if depth == 0:
                    return j
            j += 1
        raise ShellSyntaxError(f"'{open_c}' is never closed", start)

    def _braced(self, body: str, quoted: bool, at: int) -> Piece:
        m = _BRACED.fullmatch(body)
        if not m:
            return Piece("cmd", "${" + body + "}", quoted, at)  # ${#X}, ${X%…}, ${X/…}: not followed here
        name, op, rest = m.group(1), m.group(2) or "", m.group(3)
        default: tuple[Piece, ...] = ()
        if op:
            if self.depth >= MAX_DEPTH:
                raise ShellSyntaxError(f"expansions nested deeper than {MAX_DEPTH}", at)
            start = at + 2 + len(body) - len(rest)
            inner = _Reader(self.s, start, at + 2 + len(body), self.depth + 1)
            word = inner._word() if rest else ShellWord([], start)
            if inner.i < inner.n:  # spaces in a default: kept as written
                word = ShellWord([Piece("lit", rest, quoted, start)], start)
            default = tuple(
                Piece(p.kind, p.text, p.quoted or quoted, p.offset, p.op, p.default, p.braced) for p in word.pieces
            )
        return Piece("var", name, quoted, at, op, default, braced=True)


def read_commands(text: str, start: int = 0, end: int | None = None) -> list[Command]:
    """The simple commands of a shell script (or of ``text[start:end]``, offsets staying the file's), in order."""
    return _Reader(text, start, end).run()
