"""The weights a launch depends on, recorded at ``preflight manifest push`` and checked on the node before vLLM starts.

The record (a manifest's ``files``, carried into each signed plan as ``node_checks.weights``)::

    {"config_sha256": hex, "quantization": "fp8" | None, "hf_quant_config_sha256": hex | None,
     "total_size": int | None, "shards": [{"name": "model-00001-of-00030.safetensors", "size": int,
                                           "sha256": hex (with --hash-shards)}, ...]}

Bounded work on hostile input: small files are read up to a limit, the index is parsed only below 64 MiB and may
name at most MAX_SHARDS shards, shard names are plain file names (no ``/``, ``\\``, ``..``, NUL or control
characters: path traversal is refused, not normalised), only regular files are read (a FIFO or a device never
blocks the agent), and a symlink is followed only to a file inside the weights directory — or, for a Hugging Face
cache snapshot (``…/snapshots/REV``), inside that repository's cache folder (``…/blobs``).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import stat
from dataclasses import dataclass
from typing import Callable

from ..domain.errors import DomainError
from ..domain.quant_tag import parse_quantization_txt
from ..domain.versions import ALL_QUANT_METHODS

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MAX_SMALL = 16 << 20  # config.json, hf_quant_config.json
MAX_TAG = 64 << 10  # quantization.txt
MAX_INDEX = 64 << 20
MAX_SHARDS = 4096
SHARD_NAME = re.compile(r"^(?!\.{1,2}$)[^/\\\x00-\x1f\x7f]{1,255}$")
CHUNK = 8 << 20


class WeightsError(Exception):
    """The directory cannot be described (no config.json, an unreadable or hostile index, …)."""


def shard_name_problem(name: object) -> str | None:
    """Why ``name`` is not a plain file name inside the weights directory (None when it is)."""
    if not isinstance(name, str) or not SHARD_NAME.fullmatch(name) or name in (".", ".."):
        return f"shard name {str(name)[:80]!r} is not a plain file name (no '/', '\\\\', '..' or control characters)"
    return None


def _allowed_root(directory: pathlib.Path) -> pathlib.Path:
    d = directory.resolve()
    if d.parent.name == "snapshots":  # huggingface_hub's cache: snapshots/REV/file -> ../../blobs/SHA
        return d.parent.parent
    return d


def open_regular(directory: pathlib.Path, name: str) -> tuple[pathlib.Path, os.stat_result] | None:
    """The file ``name`` in ``directory`` when it is a regular file inside the allowed root; None when missing.
    Raises WeightsError for a hostile name, a symlink out of the directory, or something not a regular file."""
    problem = shard_name_problem(name)
    if problem:
        raise WeightsError(problem)
    path = directory / name
    try:
        os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise WeightsError(f"{name}: {exc.strerror}") from None
    try:
        real = path.resolve(strict=True)
    except (FileNotFoundError, RuntimeError):
        raise WeightsError(f"{name}: a dangling or looping symlink") from None
    root = _allowed_root(directory)
    if real != root and root not in real.parents:
        raise WeightsError(f"{name}: a symlink to {real}, outside the weights directory {root}")
    st = os.stat(real)
    if not stat.S_ISREG(st.st_mode):
        raise WeightsError(f"{name}: not a regular file")
    return real, st


def _read_small(directory: pathlib.Path, name: str, limit: int) -> bytes | None:
    found = open_regular(directory, name)
    if found is None:
        return None
    real, st = found
    if st.st_size > limit:
        raise WeightsError(f"{name}: {st.st_size} bytes, more than the {limit} this file may have")
    with open(real, "rb") as fh:
        return fh.read(limit + 1)[:limit]


def sha256_file(path: pathlib.Path, size: int, on_bytes: Callable[[int], None] | None = None) -> str:
    """SHA-256 of the first ``size`` bytes (the size already checked): never reads past what was recorded."""
    h, left = hashlib.sha256(), size
    with open(path, "rb") as fh:
        while left > 0:
            chunk = fh.read(min(CHUNK, left))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
            if on_bytes:
                on_bytes(len(chunk))
    return h.hexdigest()


def quant_method(text: bytes) -> str:
    try:
        return parse_quantization_txt(text.decode("utf-8", "replace"), ALL_QUANT_METHODS, "quantization.txt").method
    except DomainError as exc:
        raise WeightsError(f"quantization.txt: {exc.message}") from None


def shard_list(directory: pathlib.Path) -> tuple[int | None, list[str]]:
    """The safetensors index's total_size and its shard names (in order, each once); a single
    ``model.safetensors`` without an index is one shard. Raises WeightsError for a hostile index."""
    raw = _read_small(directory, INDEX, MAX_INDEX)
    if raw is None:
        return None, [SINGLE] if open_regular(directory, SINGLE) is not None else []
    try:
        index = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise WeightsError(f"{INDEX} is not JSON: {str(exc)[:120]}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise WeightsError(f"{INDEX} has no weight_map object")
    total = (index.get("metadata") or {}).get("total_size") if isinstance(index.get("metadata"), dict) else None
    if not (isinstance(total, int) and not isinstance(total, bool) and 0 <= total < 1 << 50):
        total = None
    names: dict[str, None] = {}
    for value in weight_map.values():
        problem = shard_name_problem(value)
        if problem:
            raise WeightsError(f"{INDEX}: {problem}")
        names[value] = None
        if len(names) > MAX_SHARDS:
            raise WeightsError(f"{INDEX} names more than {MAX_SHARDS} shard files")
    return total, list(names)


def describe(directory: pathlib.Path, *, hash_shards: bool = False,
             on_bytes: Callable[[int], None] | None = None) -> dict:
    """The record of a model directory (see the module docstring). Raises WeightsError."""
    directory = pathlib.Path(directory)
    config = _read_small(directory, "config.json", MAX_SMALL)
    if config is None:
        raise WeightsError(f"{directory} has no config.json")
    tag = _read_small(directory, "quantization.txt", MAX_TAG)
    hf_quant = _read_small(directory, "hf_quant_config.json", MAX_SMALL)
    total, names = shard_list(directory)
    shards = []
    for name in names:
        found = open_regular(directory, name)
        if found is None:
            raise WeightsError(f"{INDEX} names {name}, which is not in {directory}")
        shards.append({"name": name, "size": found[1].st_size})
    if hash_shards:
        for s in shards:
            s["sha256"] = sha256_file(open_regular(directory, s["name"])[0], s["size"], on_bytes)
    return {"config_sha256": hashlib.sha256(config).hexdigest(),
            "quantization": quant_method(tag) if tag is not None else None,
            "hf_quant_config_sha256": hashlib.sha256(hf_quant).hexdigest() if hf_quant is not None else None,
            "total_size": total, "shards": shards}


@dataclass(frozen=True)
class Mismatch:
    file: str
    expected: str
    found: str

    def message(self) -> str:
        return f"{self.file}: the manifest records {self.expected}, the node has {self.found}"


def check(directory: pathlib.Path, record: dict, *, verify_hashes: bool = False,
          on_bytes: Callable[[int], None] | None = None) -> list[Mismatch]:
    """Compare the weights directory with the manifest's record: config.json's digest, the quantization tag,
    hf_quant_config.json's digest, every shard present with its size (and its SHA-256 when recorded and
    ``verify_hashes``). Returns the mismatches (empty: the weights are the ones the plan was validated for).
    Hostile names or files are mismatches too, never an exception."""
    directory = pathlib.Path(directory)
    out: list[Mismatch] = []

    def small(name: str, limit: int) -> tuple[bytes | None, str | None]:
        try:
            return _read_small(directory, name, limit), None
        except (WeightsError, OSError) as exc:
            return None, str(exc)

    if not directory.is_dir():
        return [Mismatch(str(directory), "a weights directory", "no such directory")]
    config, err = small("config.json", MAX_SMALL)
    want = record.get("config_sha256")
    if err or config is None:
        out.append(Mismatch("config.json", f"sha256 {want}", err or "no such file"))
    elif want and hashlib.sha256(config).hexdigest() != want:
        out.append(Mismatch("config.json", f"sha256 {want}", f"sha256 {hashlib.sha256(config).hexdigest()}"))
    tag, err = small("quantization.txt", MAX_TAG)
    want_q = record.get("quantization")
    if err:
        out.append(Mismatch("quantization.txt", f"tag {want_q}", err))
    else:
        try:
            found_q = quant_method(tag) if tag is not None else None
        except WeightsError as exc:
            found_q = f"an unreadable tag ({exc})"
        if (found_q or "none") != (want_q or "none"):
            out.append(Mismatch("quantization.txt", f"tag {want_q}" if want_q else "no tag",
                                f"tag {found_q}" if tag is not None else "no quantization.txt"))
    hq, err = small("hf_quant_config.json", MAX_SMALL)
    want_h = record.get("hf_quant_config_sha256")
    found_h = hashlib.sha256(hq).hexdigest() if hq is not None else None
    if err:
        out.append(Mismatch("hf_quant_config.json", f"sha256 {want_h}", err))
    elif found_h != want_h:
        out.append(Mismatch("hf_quant_config.json", f"sha256 {want_h}" if want_h else "no file",
                            f"sha256 {found_h}" if found_h else "no such file"))
    for shard in (record.get("shards") or [])[:MAX_SHARDS]:
        name = shard.get("name") if isinstance(shard, dict) else None
        try:
            found = open_regular(directory, name)
        except (WeightsError, OSError) as exc:
            out.append(Mismatch(str(name)[:255], f"{shard.get('size')} bytes", str(exc)))
            continue
        if found is None:
            out.append(Mismatch(name, f"{shard.get('size')} bytes", "no such file"))
        elif found[1].st_size != shard.get("size"):
            out.append(Mismatch(name, f"{shard.get('size')} bytes", f"{found[1].st_size} bytes"))
        elif verify_hashes and shard.get("sha256"):
            digest = sha256_file(found[0], found[1].st_size, on_bytes)
            if digest != shard["sha256"]:
                out.append(Mismatch(name, f"sha256 {shard['sha256']}", f"sha256 {digest}"))
    return out


def local_directory(model_uri: str, weights_root: pathlib.Path | None) -> pathlib.Path | None:
    """Where the node's weights for ``model_uri`` are: the path itself for an absolute local path; for a remote URI
    (``s3://bucket/key``, ``gs://…``, ``az://…``) or a repository id, ``weights_root / <the URI without its
    scheme>``; None when remote and no ``--weights-root`` is given (the weights are then not checked). Refuses a
    mapping that would leave ``weights_root`` (``..`` in the URI)."""
    if model_uri.startswith("/"):
        return pathlib.Path(model_uri)
    if weights_root is None:
        return None
    rest = re.sub(r"^[a-z][a-z0-9+.-]*://", "", model_uri).strip("/")
    parts = [p for p in rest.split("/") if p]
    if not parts or any(p in (".", "..") or shard_name_problem(p) for p in parts):
        raise WeightsError(f"model uri {model_uri!r} cannot be mapped under --weights-root")
    return pathlib.Path(weights_root).joinpath(*parts)
