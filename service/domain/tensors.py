"""A checkpoint's tensor inventory, read from its safetensors headers only (never a weight byte).

The format (safetensors v0.8.0-rc.0 ``safetensors/src/tensor.rs``; the file reads the same in v0.7.0):
8 bytes, a little-endian u64 ``N``; ``N`` bytes of UTF-8 JSON, an object mapping each tensor name to
``{"dtype": D, "shape": [d0, d1, …], "data_offsets": [begin, end]}`` plus an optional ``"__metadata__"`` object of
string values; then the data buffer. What safetensors itself refuses is refused here, with the file and the tensor
named, so a checkpoint vLLM could not open (it opens every shard through safetensors) is never described as one:

- ``N`` above 100,000,000 (``MAX_HEADER_SIZE``, tensor.rs:10; refused at tensor.rs:394 ``HeaderTooLarge``) or past
  the end of the file (tensor.rs:398-403 ``InvalidHeaderLength``);
- a header that is not UTF-8 JSON (tensor.rs:404-408); a dtype outside safetensors' ``Dtype`` (tensor.rs:803-855);
- offsets that do not tile the data buffer: sorted by offsets, each tensor must begin where the previous ended,
  the first at 0 (``Metadata::validate``, tensor.rs:619-630: an overlap or a gap is ``InvalidOffset``), span
  exactly ``prod(shape) × bits(dtype) / 8`` bytes (tensor.rs:632-652 ``TensorInvalidInfo``, ``MisalignedSlice``),
  and the last end where the file ends (tensor.rs:412 ``MetadataIncompleteBuffer``).

Refused here beyond safetensors, for hostile input: a JSON object with a key twice (serde keeps the last one; a
header that says two things about a tensor is not described), more than MAX_TENSORS tensors per file or checkpoint
(counted on the raw bytes before any JSON is parsed, so 10^6 tensors are refused in milliseconds), names longer than
MAX_NAME characters or not encodable as UTF-8 (lone surrogates), more than MAX_DIMS dimensions, a
``__metadata__`` that is not an object of strings. Every refusal is a TensorsError naming the file and the tensor.

The *layout digest* (``layout_digest``) identifies which tensors a checkpoint holds, with their dtypes and shapes,
whatever files they are spread over and whatever their offsets; the node agent recomputes it from the headers of
the files it holds. See ``layout_digest`` for its canonical byte form.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import IO, Any

from .errors import DomainError

# safetensors v0.8.0-rc.0 safetensors/src/tensor.rs:10 ``const MAX_HEADER_SIZE: usize = 100_000_000;``
MAX_HEADER_BYTES = 100_000_000
# Hostile-input bounds of our own. The largest public checkpoints hold ~150k tensors in all (Kimi-K2's 384 experts
# × 61 layers × 3 projections × weight and scale); a GPTQ pack of such a model ~300k.
MAX_TENSORS = 500_000
MAX_NAME = 1024
MAX_DIMS = 32
MAX_DIM = 1 << 62
MAX_METADATA_ENTRIES = 4096

# safetensors v0.8.0-rc.0 safetensors/src/tensor.rs:803-855 (``enum Dtype``) and :859-893 (``bitsize``)
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "F64": 64,
    "C64": 64,
    "I64": 64,
    "U64": 64,
}

LAYOUT_DIGEST_TAG = b"preflight-safetensors-layout/1\n"


class TensorsError(DomainError):
    """A safetensors header (or index) that cannot be described; ``file`` and ``tensor`` name where (a 422 naming
    the field ``tensors`` when it reaches the API)."""

    def __init__(self, file: str, problem: str, *, tensor: str | None = None, rule: str = "safetensors_header"):
        where = f"{file}: tensor {_show(tensor)}: " if tensor is not None else f"{file}: "
        super().__init__("tensors", where + problem, rule=rule)
        self.file = file
        self.tensor = tensor
        self.problem = problem


def _show(name: str, limit: int = 120) -> str:
    """A tensor name for a message: quoted, escaped, cut to ``limit`` characters."""
    return repr(name[:limit] + ("…" if len(name) > limit else ""))


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its header describes it; ``nbytes`` = ``end - begin``; ``file`` the shard holding it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    file: str
    begin: int = 0


@dataclass(frozen=True)
class FileHeader:
    """One safetensors file's header: its tensors in offset order, its ``__metadata__``, and its sizes."""

    file: str
    header_bytes: int  # N, the JSON's length
    data_bytes: int  # the data buffer's length (the last tensor's end)
    tensors: tuple[TensorInfo, ...]
    metadata: Mapping[str, str] = field(default_factory=dict)


def header_length(prefix: bytes, file: str, file_size: int | None = None) -> int:
    """``N`` from a file's first 8 bytes, checked against MAX_HEADER_BYTES and ``file_size`` (when known)."""
    if len(prefix) < 8:
        raise TensorsError(file, f"{len(prefix)} bytes, too short for a safetensors file (8 bytes of header length)")
    if prefix[:4] == b"GGUF":  # llama.cpp's format (its magic): vLLM reads it with its own loader, not safetensors
        raise TensorsError(file, "a GGUF file, not safetensors: no tensor inventory is read from it", rule="gguf")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER_BYTES:
        raise TensorsError(
            file, f"header length {n} is more than the {MAX_HEADER_BYTES} bytes safetensors allows (HeaderTooLarge)"
        )
    if file_size is not None and 8 + n > file_size:
        raise TensorsError(file, f"header length {n} runs past the end of the file ({file_size} bytes)")
    return int(n)


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, v in pairs:
            if k in seen:
                raise _Duplicate(k, isinstance(v, dict))
            seen.add(k)
    return out


class _Duplicate(ValueError):
    def __init__(self, key: str, entry: bool):
        super().__init__(key)
        self.key, self.entry = key, entry  # entry: the key names an object (a tensor), not a field of one


MAX_LOOSE_KEYS = 4096  # keys outside tensor objects: the header's own and __metadata__'s


def _load_json(raw: bytes, file: str) -> Any:
    """The header's JSON; refused before parsing when it has room for more than MAX_TENSORS objects (every tensor
    is an object ``{…}``, so ``raw.count(b"{")`` bounds the tensor count from above in one C pass)."""
    objects = raw.count(b"{")
    if objects > MAX_TENSORS + 2:  # the header object and __metadata__
        raise TensorsError(file, f"the header holds more than {MAX_TENSORS} objects (tensors): refused unread")
    # every entry holds a ':', a tensor's object three more: entries that are no objects (each one refused after the
    # parse) cannot make the parse itself cost more than the objects allow
    if raw.count(b":") > 4 * objects + MAX_LOOSE_KEYS:
        raise TensorsError(file, "the header holds more entries than tensor objects: refused unread")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TensorsError(file, f"the header is not UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text, object_pairs_hook=_pairs)
    except _Duplicate as exc:
        if exc.entry:
            raise TensorsError(file, "appears twice in the header", tensor=exc.key) from None
        raise TensorsError(file, f"the key {exc.key[:120]!r} appears twice in one object of the header") from None
    except RecursionError:
        raise TensorsError(file, "the header's JSON nests too deeply") from None
    except ValueError as exc:
        raise TensorsError(file, f"the header is not JSON ({str(exc)[:120]})") from None


def _int(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_DIM  # type(): a bool is no dimension


def _tensor(name: str, value: object, file: str) -> TensorInfo:
    """One header entry, checked (dtype, shape, offsets consistent with dtype × shape)."""
    if len(name) > MAX_NAME:
        raise TensorsError(file, f"a name of {len(name)} characters (at most {MAX_NAME})", tensor=name)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise TensorsError(file, "the name is not Unicode text (a lone surrogate)", tensor=name) from None
    if not isinstance(value, dict):
        raise TensorsError(file, "is not an object {dtype, shape, data_offsets}", tensor=name)
    dtype, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise TensorsError(
            file, f"dtype {str(dtype)[:40]!r} is not a safetensors dtype ({', '.join(DTYPE_BITS)})", tensor=name
        )
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_int(d) for d in shape):
        raise TensorsError(
            file, f"shape {str(shape)[:80]} is not a list of at most {MAX_DIMS} non-negative integers", tensor=name
        )
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_int(o) for o in offsets)):
        raise TensorsError(file, f"data_offsets {str(offsets)[:80]} is not [begin, end]", tensor=name)
    begin, end = offsets
    if end < begin:
        raise TensorsError(file, f"data_offsets [{begin}, {end}] end before they begin", tensor=name)
    elements = 1
    for d in shape:
        elements *= d
    bits = elements * DTYPE_BITS[str(dtype)]
    if bits % 8:
        raise TensorsError(file, f"{elements} elements of {dtype} are not a whole number of bytes", tensor=name)
    if end - begin != bits // 8:
        raise TensorsError(
            file,
            f"data_offsets [{begin}, {end}] span {end - begin} bytes, but {dtype} {shape} is {bits // 8} bytes",
            tensor=name,
        )
    return TensorInfo(name, str(dtype), tuple(shape), end - begin, file, begin)


def _metadata(value: object, file: str) -> dict[str, str]:
    if not (isinstance(value, dict) and len(value) <= MAX_METADATA_ENTRIES):
        raise TensorsError(file, f"__metadata__ is not an object of at most {MAX_METADATA_ENTRIES} entries")
    for k, v in value.items():
        if not isinstance(v, str):
            raise TensorsError(file, f"__metadata__[{_show(k, 60)}] is not a string")
    return value


def _tile(tensors: list[TensorInfo], file: str, data_bytes: int | None) -> int:
    """Sorted by offsets, the tensors must tile [0, end) with no overlap and no gap (safetensors v0.8.0-rc.0
    tensor.rs:619-630); the buffer must end where the last tensor ends (tensor.rs:412). Returns the end."""
    tensors.sort(key=lambda t: (t.begin, t.begin + t.nbytes))
    at, previous = 0, None
    for t in tensors:
        if t.begin < at:
            raise TensorsError(
                file, f"data_offsets begin at {t.begin}, inside {_show(previous or '')} (ends at {at})", tensor=t.name
            )
        if t.begin > at:
            where = f"after {_show(previous)} ends" if previous else "at the start of the data"
            raise TensorsError(
                file, f"data_offsets begin at {t.begin}: a gap of {t.begin - at} bytes {where}", tensor=t.name
            )
        at, previous = t.begin + t.nbytes, t.name
    if data_bytes is not None and at != data_bytes:
        if at > data_bytes:
            last = next(t for t in tensors if t.begin + t.nbytes > data_bytes)
            raise TensorsError(
                file,
                f"ends at data offset {last.begin + last.nbytes}, past the end of the file ({data_bytes} data bytes)",
                tensor=last.name,
            )
        raise TensorsError(file, f"{data_bytes - at} bytes after the last tensor are covered by none")
    return at


def parse_header(raw: bytes, file: str, *, file_size: int | None = None) -> FileHeader:
    """A file's header from ``raw``, its first ``8 + N`` bytes (or more: the rest is ignored). ``file_size``, when
    known, is the file's whole size: the tensors must then end exactly where the file does. Raises TensorsError."""
    n = header_length(raw, file, file_size)
    if len(raw) < 8 + n:
        raise TensorsError(file, f"header length {n} runs past the {len(raw) - 8} header bytes at hand")
    value = _load_json(raw[8 : 8 + n], file)
    if not isinstance(value, dict):
        raise TensorsError(file, "the header is not a JSON object")
    metadata: dict[str, str] = {}
    tensors: list[TensorInfo] = []
    for name, entry in value.items():
        if name == "__metadata__":
            metadata = _metadata(entry, file)
        else:
            tensors.append(_tensor(name, entry, file))
    end = _tile(tensors, file, None if file_size is None else file_size - 8 - n)
    return FileHeader(file, n, end, tuple(tensors), metadata)


def read_header(fh: IO[bytes], file: str, *, file_size: int | None = None) -> FileHeader:
    """A file's header read from the binary file object ``fh`` (positioned at the start): 8 bytes, then exactly
    ``N`` bytes — never the data. Raises TensorsError (an OSError from ``fh`` is the caller's)."""
    prefix = _read_exactly(fh, 8)
    n = header_length(prefix, file, file_size)
    body = _read_exactly(fh, n)
    if len(body) < n:
        raise TensorsError(file, f"header length {n} runs past the end of the file ({8 + len(body)} bytes)")
    return parse_header(prefix + body, file, file_size=file_size)


def _read_exactly(fh: IO[bytes], n: int) -> bytes:
    parts, left = [], n
    while left > 0:
        chunk = fh.read(min(left, 8 << 20))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


INDEX = "model.safetensors.index.json"
MAX_INDEX_BYTES = 64 << 20  # as service/agent/weights.py MAX_INDEX


@dataclass(frozen=True)
class SafetensorsIndex:
    """``model.safetensors.index.json``: ``weight_map`` (tensor name -> shard file), the shards in first-named
    order (each once), and ``metadata.total_size`` when it is a non-negative integer."""

    weight_map: Mapping[str, str]
    files: tuple[str, ...]
    total_size: int | None


def parse_index(raw: bytes, file: str = INDEX) -> SafetensorsIndex:
    """The index's weight map, checked: an object of tensor name -> file name, names bounded like a header's.
    A shard's file name is the reader's to check (it is a path on its disk). Raises TensorsError."""
    if len(raw) > MAX_INDEX_BYTES:
        raise TensorsError(
            file, f"{len(raw)} bytes, more than the {MAX_INDEX_BYTES} an index may have", rule="safetensors_index"
        )
    if raw.count(b":") > 2 * MAX_TENSORS + 64:  # one per weight_map entry, before parsing
        raise TensorsError(file, f"names more than {MAX_TENSORS} tensors: refused unread", rule="safetensors_index")
    value = _load_json(raw, file)
    weight_map = value.get("weight_map") if isinstance(value, dict) else None
    if not isinstance(weight_map, dict):
        raise TensorsError(file, "has no weight_map object", rule="safetensors_index")
    files: dict[str, None] = {}
    for name, shard in weight_map.items():
        if len(name) > MAX_NAME:
            raise TensorsError(
                file, f"a name of {len(name)} characters (at most {MAX_NAME})", tensor=name, rule="safetensors_index"
            )
        if not isinstance(shard, str) or not shard:
            raise TensorsError(file, "weight_map names no file for it", tensor=name, rule="safetensors_index")
        files[shard] = None
    meta = value.get("metadata")
    total = meta.get("total_size") if isinstance(meta, dict) else None
    ok = type(total) is int and 0 <= total <= MAX_DIM
    return SafetensorsIndex(weight_map, tuple(files), total if ok else None)


@dataclass(frozen=True)
class DtypeTotal:
    tensors: int
    bytes: int


@dataclass(frozen=True)
class Inventory:
    """A checkpoint's tensors (by name; each in one file), its files, totals by dtype and in all."""

    tensors: Mapping[str, TensorInfo]
    files: tuple[FileHeader, ...]
    by_dtype: Mapping[str, DtypeTotal]
    total_bytes: int
    layout_digest: str

    def summary(self) -> dict[str, Any]:
        """What a manifest stores: counts and bytes, by dtype and per file, and the layout digest (not the
        tensors themselves: a big MoE has ~10^5 of them)."""
        return {
            "layout_digest": self.layout_digest,
            "tensor_count": len(self.tensors),
            "total_bytes": self.total_bytes,
            "by_dtype": {d: {"tensors": t.tensors, "bytes": t.bytes} for d, t in sorted(self.by_dtype.items())},
            "files": [
                {"name": f.file, "header_bytes": f.header_bytes, "data_bytes": f.data_bytes, "tensors": len(f.tensors)}
                for f in self.files
            ],
        }


def layout_digest(tensors: Iterable[tuple[str, str, Sequence[int]]]) -> str:
    """``"sha256:" + hex`` of the checkpoint's layout: which tensors, of which dtype and shape — not which file
    holds them, nor where (resharding the same tensors keeps the digest; changing one dtype or shape changes it).

    Canonical bytes, hashed with SHA-256 (``u64(x)``: x as 8 bytes, little-endian)::

        b"preflight-safetensors-layout/1\\n"
        then, for every tensor in ascending order of its name's UTF-8 bytes (names are unique):
            u64(len(name_utf8)) || name_utf8
            u64(len(dtype)) || dtype            (the safetensors dtype as spelled in the header, ASCII: "BF16")
            u64(len(shape)) || u64(shape[0]) || … || u64(shape[-1])

    The length prefixes make the sequence unambiguous (no separator a name could contain). A scalar tensor
    (shape ``[]``) contributes ``u64(0)`` for its shape. In a checkpoint saved per rank (every file named as
    vLLM's ShardedStateLoader writes them, ``rank_scope``), a tensor's name is ``"<scope>/<name>"``
    (``rank0/model.layers.0.self_attn.qkv_proj.weight``): each rank's slice counts as a tensor of its own."""
    h = hashlib.sha256(LAYOUT_DIGEST_TAG)
    pack = struct.Struct("<Q").pack
    for name, dtype, shape in sorted(((n.encode("utf-8"), d, s) for n, d, s in tensors), key=lambda x: x[0]):
        h.update(pack(len(name)) + name)
        d = dtype.encode("ascii")
        h.update(pack(len(d)) + d)
        h.update(pack(len(shape)) + b"".join(pack(x) for x in shape))
    return "sha256:" + h.hexdigest()


# vllm 0.33.0 vllm/model_executor/model_loader/sharded_state_loader.py:38-39: a checkpoint saved per rank
RANK_FILE = re.compile(r"model-(?:rank-(?P<rank>\d+)|pp-(?P<pp>\d+)-tp-(?P<tp>\d+))-part-\d+\.safetensors")


def rank_scope(file: str) -> str | None:
    """``rank0`` / ``pp1-tp0`` for a file of a checkpoint saved per rank (``model-rank-0-part-0.safetensors``,
    ``model-pp-1-tp-0-part-0.safetensors``); None for any other file."""
    m = RANK_FILE.fullmatch(file)
    if m is None:
        return None
    return f"rank{int(m['rank'])}" if m["rank"] is not None else f"pp{int(m['pp'])}-tp{int(m['tp'])}"


def build_inventory(headers: Sequence[FileHeader], index: SafetensorsIndex | None = None) -> Inventory:
    """The checkpoint's inventory from its files' headers (``index``: the weight map, when it has one). A tensor in
    two files, or a weight_map naming a file for a tensor that another file holds, is refused (which one vLLM
    would keep is not for a manifest to guess). Raises TensorsError."""
    tensors: dict[str, TensorInfo] = {}
    # per-rank files hold the same names, each its rank's slice: named "<scope>/<name>" (rank_scope)
    scoped = bool(headers) and all(rank_scope(h.file) for h in headers)
    for header in headers:
        scope = rank_scope(header.file) if scoped else None
        for t in header.tensors:
            if scope is not None:
                t = replace(t, name=f"{scope}/{t.name}")
            other = tensors.get(t.name)
            if other is not None:
                raise TensorsError(header.file, f"is also in {other.file}", tensor=t.name)
            tensors[t.name] = t
            if len(tensors) > MAX_TENSORS:
                raise TensorsError(header.file, f"the checkpoint holds more than {MAX_TENSORS} tensors")
    if index is not None:
        for name, shard in index.weight_map.items():
            held = tensors.get(name)
            if held is not None and held.file != shard:
                raise TensorsError(INDEX, f"weight_map says it is in {shard}, but {held.file} holds it", tensor=name)
    counts: dict[str, list[int]] = {}
    for t in tensors.values():
        c = counts.setdefault(t.dtype, [0, 0])
        c[0] += 1
        c[1] += t.nbytes
    return Inventory(
        tensors=dict(sorted(tensors.items())),
        files=tuple(headers),
        by_dtype={d: DtypeTotal(c[0], c[1]) for d, c in sorted(counts.items())},
        total_bytes=sum(c[1] for c in counts.values()),
        layout_digest=layout_digest((t.name, t.dtype, t.shape) for t in tensors.values()),
    )
