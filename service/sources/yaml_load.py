"""YAML read as hostile input, with the line and column of every node: the shared loader of the compose, Kubernetes,
KServe and Helm readers.

ruamel.yaml's event parser (imported lazily: the JSON path of ``preflight check`` never loads it) is linear in the
input; the tree is built here from its events rather than by ruamel's composer and constructor, so that

- an alias is a reference to the anchored node, never a copy, and the size of the tree with every alias expanded is
  counted as it is built: a "billion laughs" document is refused after ``MAX_NODES`` expanded nodes, not expanded;
- nesting is bounded (``MAX_DEPTH``, aliases included) without recursion in the parser;
- every node keeps its source offsets, so a word split out of a scalar can be located inside it.

Limits refuse with ``YamlError`` (a located SourceError) naming the file and, where known, the line."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from .found import SourceError, Span

MAX_BYTES = 2 * 2**20  # a deploy file is a few KB; the largest real production-stack values file is ~40 KB
MAX_NODES = 100_000  # nodes with every alias expanded
MAX_DEPTH = 64  # nesting, aliases included (a Kubernetes pod template is ~12 deep)
MAX_DOCUMENTS = 1_000


class YamlError(SourceError):
    """A file the readers refuse: not YAML, too large, too deep, too many nodes or binary; located at the line (and
    column) where known, else the file's start."""

    def __init__(self, file: str, message: str, line: int | None = None, col: int | None = None) -> None:
        super().__init__(message, Span(file, line or 1, col or 1))
        self.file, self.line, self.message = file, line, message


@dataclass(eq=False, slots=True)
class Node:
    """A YAML node: ``kind`` map (``items``: key/value pairs), seq (``items``: nodes) or scalar (``text``). ``line``
    and ``col`` are 1-based; ``start``/``end`` are offsets into the document text. Aliased nodes are shared."""

    kind: str
    line: int
    col: int
    start: int
    end: int = 0
    text: str = ""
    style: str | None = None  # scalar: None (plain), "'", '"', "|", ">"
    tag: str | None = None
    items: list = field(default_factory=list)
    size: int = 1  # nodes with aliases expanded
    height: int = 1

    def get(self, key: str) -> Node | None:
        """The value of ``key`` in a mapping (merge keys ``<<`` applied), None when absent or not a mapping."""
        for k, v in pairs(self):
            if k == key:
                return v
        return None

    def path(self, *keys: str | int) -> Node | None:
        node: Node | None = self
        for k in keys:
            if node is None:
                return None
            if isinstance(k, int):
                node = node.items[k] if node.kind == "seq" and -len(node.items) <= k < len(node.items) else None
            else:
                node = node.get(k)
        return node

    @property
    def is_null(self) -> bool:
        return self.kind == "scalar" and self.style is None and self.tag is None and self.text in _NULLS


_NULLS = {"", "~", "null", "Null", "NULL"}
_TRUE = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", "y", "Y"}
_FALSE = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", "n", "N"}
_INT = re.compile(r"[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+|0o?[0-7_]+")
_FLOAT = re.compile(
    r"[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
)


def pairs(node: Node | None) -> Iterator[tuple[str, Node]]:
    """A mapping's (key text, value) pairs, merge keys (``<<: *base``) applied as YAML 1.1 and Compose do: explicit
    keys first, then the merged mappings' keys they do not set."""
    if node is None or node.kind != "map":
        return
    seen: set[str] = set()
    merged: list[Node] = []
    for k, v in node.items:
        if k.kind != "scalar":
            continue
        if k.text == "<<" and k.style is None:
            merged.extend(
                [v] if v.kind == "map" else [m for m in v.items if m.kind == "map"] if v.kind == "seq" else []
            )
            continue
        seen.add(k.text)
        yield k.text, v
    for m in merged:
        for k2, v2 in pairs(m):
            if k2 not in seen:
                seen.add(k2)
                yield k2, v2


def scalar_type(node: Node) -> str:
    """What a scalar resolves to as Go's YAML (Kubernetes, Helm, Compose) reads it: str, int, float, bool, null."""
    if node.kind != "scalar":
        return node.kind
    if node.tag is not None:
        return {"tag:yaml.org,2002:int": "int", "tag:yaml.org,2002:float": "float"}.get(node.tag, "str")
    if node.style is not None:
        return "str"
    t = node.text
    if t in _NULLS:
        return "null"
    if t in _TRUE or t in _FALSE:
        return "bool"
    if _INT.fullmatch(t):
        return "int"
    if _FLOAT.fullmatch(t):
        return "float"
    return "str"


def as_bool(node: Node | None) -> bool | None:
    if node is None or scalar_type(node) != "bool":
        return None
    return node.text in _TRUE


def as_int(node: Node | None) -> int | None:
    """An integer scalar (plain or quoted: Kubernetes quantities such as ``nvidia.com/gpu: "8"``), None otherwise."""
    if node is None or node.kind != "scalar":
        return None
    t = node.text.strip().replace("_", "")
    return int(t) if re.fullmatch(r"[+]?[0-9]{1,9}", t) else None


class Source:
    """The document text and its line starts: offsets to 1-based (line, col)."""

    def __init__(self, file: str, text: str) -> None:
        self.file, self.text = file, text
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def at(self, offset: int) -> tuple[int, int]:
        i = bisect.bisect_right(self.starts, offset) - 1
        return i + 1, offset - self.starts[i] + 1


def load_all(file: str, text: str) -> tuple[Source, list[Node]]:
    """Every document of a YAML stream as a tree of Nodes (empty documents left out)."""
    if len(text) > MAX_BYTES:
        raise YamlError(file, f"the file is larger than {MAX_BYTES} bytes")
    if "\x00" in text:
        raise YamlError(
            file, "the file is binary (it holds NUL characters)", text[: text.index("\x00")].count("\n") + 1
        )
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    src = Source(file, text)
    try:
        docs = _build(src, YAML(typ="safe", pure=True).parse(text))
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (None, None)
        raise YamlError(file, f"not YAML: {exc.problem or exc.context}", line, col) from None
    except YAMLError as exc:
        raise YamlError(file, f"not YAML: {exc}") from None
    except RecursionError:
        raise YamlError(file, "the YAML is nested too deeply") from None
    return src, docs


def _build(src: Source, events) -> list[Node]:
    from ruamel.yaml import events as ev

    docs: list[Node] = []
    anchors: dict[str, Node] = {}
    stack: list[Node] = []
    total = 0
    root: Node | None = None

    def add(node: Node) -> None:
        nonlocal root
        if not stack:
            root = node
        elif stack[-1].kind == "seq":
            stack[-1].items.append(node)
        else:
            stack[-1].items.append(node)  # key and value alternate; paired on MappingEnd

    for e in events:
        if isinstance(e, ev.DocumentStartEvent):
            anchors, root = {}, None
            continue
        if isinstance(e, ev.DocumentEndEvent):
            if root is not None and not root.is_null:
                docs.append(root)
            if len(docs) > MAX_DOCUMENTS:
                raise YamlError(src.file, f"more than {MAX_DOCUMENTS} documents")
            continue
        if isinstance(e, ev.AliasEvent):
            target = anchors.get(e.anchor)
            if target is None:
                raise YamlError(src.file, f"unknown alias *{e.anchor}", e.start_mark.line + 1)
            total += target.size
            if total > MAX_NODES:
                raise YamlError(src.file, f"more than {MAX_NODES} nodes with aliases expanded", e.start_mark.line + 1)
            add(target)
            continue
        if isinstance(e, (ev.ScalarEvent, ev.SequenceStartEvent, ev.MappingStartEvent)):
            total += 1
            if total > MAX_NODES:
                raise YamlError(src.file, f"more than {MAX_NODES} nodes with aliases expanded", e.start_mark.line + 1)
            start = e.start_mark.index
            line, col = e.start_mark.line + 1, e.start_mark.column + 1
            tag = e.tag if e.tag and e.tag != "!" else None
            if isinstance(e, ev.ScalarEvent):
                node = Node("scalar", line, col, start, e.end_mark.index, text=e.value, style=e.style or None, tag=tag)
                add(node)
            else:
                node = Node("seq" if isinstance(e, ev.SequenceStartEvent) else "map", line, col, start, tag=tag)
                add(node)
                stack.append(node)
                if len(stack) > MAX_DEPTH:
                    raise YamlError(src.file, f"nested deeper than {MAX_DEPTH} levels", line)
            if e.anchor:
                anchors[e.anchor] = node
            continue
        if isinstance(e, (ev.SequenceEndEvent, ev.MappingEndEvent)):
            node = stack.pop()
            node.end = e.end_mark.index
            kids = node.items
            node.size = 1 + sum(k.size for k in kids)
            node.height = 1 + max((k.height for k in kids), default=0)
            if node.height > MAX_DEPTH:
                raise YamlError(src.file, f"nested deeper than {MAX_DEPTH} levels (aliases expanded)", node.line)
            if node.kind == "map":
                node.items = _pair_up(src, kids)
    return docs


def _pair_up(src: Source, kids: list[Node]) -> list[tuple[Node, Node]]:
    out = list(zip(kids[0::2], kids[1::2], strict=True))
    seen: set[str] = set()
    for k, _ in out:
        if k.kind == "scalar" and k.text != "<<":
            if k.text in seen:
                raise YamlError(src.file, f"duplicate key {k.text!r}", k.line)
            seen.add(k.text)
    return out


def char_offsets(src: Source, node: Node, limit: int = 65536) -> list[int] | None:
    """The source offset of each character of a scalar's value, or None when it cannot be mapped exactly (a folded
    block, an escape this does not model, a value longer than ``limit``): then its words are located at its start.

    The mapping is rebuilt from the raw text by YAML's folding rules and kept only if it reproduces the value."""
    if node.kind != "scalar" or len(node.text) > limit or node.end - node.start > 4 * limit:
        return None
    raw_start = _skip_props(src.text, node.start, node.end)
    raw = src.text[raw_start : node.end]
    style = node.style
    if style is None:
        chars = _fold(raw, raw_start, quote=None)
    elif style in ("'", '"'):
        chars = _fold(raw[1:-1], raw_start + 1, quote=style) if len(raw) >= 2 else None
    elif style == "|":
        chars = _literal(raw, raw_start)
    elif style == ">":
        chars = _folded(raw, raw_start)
    else:
        chars = None
    if chars is None:
        return None
    value = "".join(c for c, _ in chars)
    if value != node.text and value.rstrip("\n") != node.text.rstrip("\n"):
        return None
    offs = [o for _, o in chars][: len(node.text)]
    return offs if len(offs) == len(node.text) else None


def _skip_props(text: str, start: int, end: int) -> int:
    """Past an anchor (``&a``) and a tag (``!!str``) in front of a scalar."""
    i = start
    while i < end and text[i] in "&!":
        while i < end and not text[i].isspace():
            i += 1
        while i < end and text[i] in " \t":
            i += 1
    return i


def _fold(raw: str, base: int, quote: str | None) -> list[tuple[str, int]] | None:
    """Flow scalar folding: a line break between lines is one space, an empty line is a newline, leading and trailing
    blanks of continuation lines dropped; quotes' escapes (``''``, ``\\"``, ``\\\\``, ``\\n``) taken as one char."""
    out: list[tuple[str, int]] = []
    lines = raw.split("\n")
    off = base
    pending_breaks = 0
    for n, line in enumerate(lines):
        body_start = 0 if n == 0 else len(line) - len(line.lstrip(" \t"))
        body = line[body_start:] if n == 0 else line.lstrip(" \t")
        if n < len(lines) - 1:
            stripped = body.rstrip(" \t")
            if quote == '"' and stripped.endswith("\\") and not stripped.endswith("\\\\"):
                return None  # an escaped line break: not modelled
            body = stripped
        if n > 0:
            if not body and n < len(lines) - 1:
                pending_breaks += 1
                off += len(line) + 1
                continue
            if out:
                out.extend([("\n", off)] * pending_breaks if pending_breaks else [(" ", off)])
            pending_breaks = 0
        i = 0
        col0 = off + body_start
        while i < len(body):
            c = body[i]
            if quote == "'" and c == "'" and body[i : i + 2] == "''":
                out.append(("'", col0 + i))
                i += 2
                continue
            if quote == '"' and c == "\\":
                esc = body[i + 1 : i + 2]
                simple = {'"': '"', "\\": "\\", "/": "/", "n": "\n", "t": "\t", " ": " "}
                if esc not in simple:
                    return None
                out.append((simple[esc], col0 + i))
                i += 2
                continue
            out.append((c, col0 + i))
            i += 1
        off += len(line) + 1
    return out


def _literal(raw: str, base: int) -> list[tuple[str, int]] | None:
    """A literal block (``|``): its lines less their common indentation, each kept with its newline."""
    header, _, rest = raw.partition("\n")
    if any(c.isdigit() for c in header):
        return None  # an explicit indentation indicator: not modelled
    off = base + len(header) + 1
    lines = rest.split("\n")
    indent = next((len(ln) - len(ln.lstrip(" ")) for ln in lines if ln.strip()), 0)
    out: list[tuple[str, int]] = []
    for ln in lines:
        body = ln[indent:] if len(ln) >= indent else ""
        out.extend((c, off + indent + i) for i, c in enumerate(body))
        out.append(("\n", off + len(ln)))
        off += len(ln) + 1
    return out


def _folded(raw: str, base: int) -> list[tuple[str, int]] | None:
    """A folded block (``>``): a line break between two text lines is a space, each empty line a newline (lines
    more indented than the block are kept apart: the result is checked against the value by the caller)."""
    lit = _literal(raw, base)
    if lit is None:
        return None
    lines: list[list[tuple[str, int]]] = [[]]
    for c, o in lit:
        if c == "\n":
            lines[-1].append((c, o))
            lines.append([])
        else:
            lines[-1].append((c, o))
    out: list[tuple[str, int]] = []
    for i, ln in enumerate(lines):
        body, brk = (ln[:-1], ln[-1]) if ln and ln[-1][0] == "\n" else (ln, None)
        out.extend(body)
        if brk is None:
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else []
        nbody = [c for c, _ in nxt if c != "\n"]
        joins = body and nbody and body[0][0] not in " \t" and nbody[0] not in " \t"
        out.append((" ", brk[1]) if joins else brk)
    return out
