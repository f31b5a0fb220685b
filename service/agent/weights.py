"""The weights a launch depends on, recorded at ``preflight manifest push`` and checked on the node before vLLM starts.

The record (a manifest's ``files``, carried into each signed plan as ``node_checks.weights``)::

    {"config_sha256": hex, "quantization": "fp8" | None, "hf_quant_config_sha256": hex | None,
     "total_size": int | None, "shards": [{"name": "model-00001-of-00030.safetensors", "size": int,
                                           "sha256": hex (with --hash-shards)}, ...]}

Bounded work on hostile input: small files are read up to a limit, the index is parsed only below 64 MiB and may
name at most MAX_SHARDS shards, shard names are plain file names (no ``/``, ``\\``, ``..``, NUL, control,
invisible formatting or bidirectional characters: path traversal is refused, not normalised), only regular files
are read (a FIFO or a device never blocks the agent), and a symlink is followed only to a file inside the weights
directory — or, for a Hugging Face cache snapshot (``…/snapshots/REV``), to a blob of that repository
(``…/blobs/<sha>``: the shape huggingface_hub writes, ``snapshots/REV/file -> ../../blobs/SHA``). Whatever the disk
holds (a dangling or looping symlink, permission denied, a directory where a file is expected) is a WeightsError or
a Mismatch naming the file, never a traceback.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pathlib
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..domain.errors import DomainError
from ..domain.quant_tag import parse_quantization_txt
from ..domain.text import display_text_problem
from ..domain.versions import all_quant_methods

INDEX = "model.safetensors.index.json"
SUFFIX = ".safetensors"
MAX_SMALL = 16 << 20  # config.json, hf_quant_config.json
MAX_TAG = 64 << 10  # quantization.txt
MAX_INDEX = 64 << 20
MAX_SHARDS = 4096
SHARD_NAME = re.compile(r"^(?!\.{1,2}$)[^/\\\x00-\x1f\x7f]{1,255}$")
HF_BLOB = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # git blob SHA-1 (small files) or the LFS SHA-256
CHUNK = 8 << 20


class WeightsError(Exception):
    """The directory cannot be described (no config.json, an unreadable or hostile index, …)."""


def shard_name_problem(name: object) -> str | None:
    """Why ``name`` is not a plain file name inside the weights directory (None when it is): no path, and nothing
    that displays as another name (control, invisible formatting or bidirectional characters: domain/text.py)."""
    if not isinstance(name, str) or not SHARD_NAME.fullmatch(name) or name in (".", ".."):
        return f"shard name {str(name)[:80]!r} is not a plain file name (no '/', '\\\\', '..' or control characters)"
    problem = display_text_problem(name)
    if problem:
        return f"shard name {name[:80]!r} {problem}"
    return None


def _why(exc: OSError) -> str:
    """What an OSError means for a weights file, in words (never a traceback)."""
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.ELOOP:
        return "a symlink loop"
    if exc.errno == errno.ENOENT:
        return "a dangling symlink (its target does not exist)"
    if exc.errno == errno.ENOTDIR:
        return "a path through something that is not a directory"
    if exc.errno == errno.EISDIR:
        return "a directory where a file is expected"
    return exc.strerror or exc.__class__.__name__


def _hf_blobs(root: pathlib.Path) -> pathlib.Path | None:
    """For a Hugging Face cache snapshot (``models--org--name/snapshots/REV``, resolved), the repository's
    ``blobs`` folder, where its files link to (``snapshots/REV/file -> ../../blobs/SHA``); None otherwise."""
    if root.parent.name != "snapshots":
        return None
    return (root.parent.parent / "blobs").resolve()


def open_regular(directory: pathlib.Path, name: str) -> tuple[pathlib.Path, os.stat_result] | None:
    """The file ``name`` in ``directory`` when it is a regular file there; None when there is nothing by that name.
    A symlink is followed only to a file inside the directory or — in a Hugging Face cache snapshot — to a blob of
    the same repository (``…/blobs/<40 or 64 hex digits>``, the layout huggingface_hub writes); anything else
    (an absolute target elsewhere, an escape through ``..``, another snapshot, ``refs/``) is refused. Raises
    WeightsError, never an OSError: a hostile name, a dangling or looping symlink, permission denied, a directory
    or a special file where a file is expected."""
    problem = shard_name_problem(name)
    if problem:
        raise WeightsError(problem)
    path = directory / name
    try:
        link = stat.S_ISLNK(os.lstat(path).st_mode)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise WeightsError(f"{name}: {_why(exc)}") from None
    real = path
    if link:
        try:
            real = path.resolve(strict=True)
        except RuntimeError:  # pathlib's "Symlink loop"
            raise WeightsError(f"{name}: a symlink loop") from None
        except OSError as exc:
            raise WeightsError(f"{name}: {_why(exc)}") from None
        try:
            root = directory.resolve(strict=True)
        except (OSError, RuntimeError):
            raise WeightsError(f"{name}: the weights directory {directory} cannot be resolved") from None
        blobs = _hf_blobs(root)
        inside = root in real.parents
        blob = blobs is not None and real.parent == blobs and HF_BLOB.fullmatch(real.name) is not None
        if not (inside or blob):
            where = (
                f"outside the weights directory {root}"
                if blobs is None
                else f"neither inside the snapshot {root} nor a blob of its repository ({blobs}/<sha>)"
            )
            raise WeightsError(f"{name}: a symlink to {real}, {where}")
    try:
        st = os.stat(real)
    except OSError as exc:
        raise WeightsError(f"{name}: {_why(exc)}") from None
    if stat.S_ISDIR(st.st_mode):
        raise WeightsError(f"{name}: a directory where a file is expected")
    if not stat.S_ISREG(st.st_mode):
        raise WeightsError(f"{name}: not a regular file")
    return real, st


def _open_fd(real: pathlib.Path, name: str) -> int:
    """A read descriptor on the regular file ``real`` (checked again on the descriptor: it may have been swapped
    since ``open_regular``; O_NONBLOCK so a FIFO put there meanwhile never blocks). Raises WeightsError."""
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise WeightsError(f"{name}: {_why(exc)}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise WeightsError(f"{name}: not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_small(directory: pathlib.Path, name: str, limit: int) -> bytes | None:
    found = open_regular(directory, name)
    if found is None:
        return None
    real, st = found
    if st.st_size > limit:
        raise WeightsError(f"{name}: {st.st_size} bytes, more than the {limit} this file may have")
    fd = _open_fd(real, name)
    try:
        with os.fdopen(fd, "rb") as fh:
            return fh.read(limit + 1)[:limit]
    except OSError as exc:
        raise WeightsError(f"{name}: {_why(exc)}") from None


def sha256_file(path: pathlib.Path, size: int, on_bytes: Callable[[int], None] | None = None) -> str:
    """SHA-256 of the first ``size`` bytes (the size already checked): never reads past what was recorded.
    Raises WeightsError when the file cannot be read."""
    h, left = hashlib.sha256(), size
    fd = _open_fd(pathlib.Path(path), pathlib.Path(path).name)
    try:
        with os.fdopen(fd, "rb") as fh:
            while left > 0:
                chunk = fh.read(min(CHUNK, left))
                if not chunk:
                    break
                h.update(chunk)
                left -= len(chunk)
                if on_bytes:
                    on_bytes(len(chunk))
    except OSError as exc:
        raise WeightsError(f"{pathlib.Path(path).name}: {_why(exc)}") from None
    return h.hexdigest()


def quant_method(text: bytes) -> str | None:
    try:
        # every line's methods (all catalogues read): only a manifest with a quantization.txt needs them
        return parse_quantization_txt(text.decode("utf-8", "replace"), all_quant_methods(), "quantization.txt").method
    except DomainError as exc:
        raise WeightsError(f"quantization.txt: {exc.message}") from None


def unindexed_shards(names: Iterable[str]) -> list[str]:
    """The weight files vLLM loads when there is no index: every ``*.safetensors`` among ``names`` (the top
    folder's entries: vLLM globs ``hf_folder/*.safetensors``, no subfolder), sorted, each once (vllm 0.33.0
    model_executor/model_loader/default_loader.py:185-186 ``allow_patterns``, :229-230 ``glob``; weight_utils.py
    :596-597 filters by the index only when there is one). Raises WeightsError past MAX_SHARDS or for a name that
    is no plain file name."""
    files = sorted({n for n in names if n.endswith(SUFFIX)})
    if len(files) > MAX_SHARDS:
        raise WeightsError(f"more than {MAX_SHARDS} *{SUFFIX} files")
    for name in files:
        problem = shard_name_problem(name)
        if problem:
            raise WeightsError(problem)
    return files


def shard_list(directory: pathlib.Path) -> tuple[int | None, list[str]]:
    """The safetensors index's total_size and its shard names (in order, each once); without an index, every
    ``*.safetensors`` of the directory (``unindexed_shards``). Raises WeightsError for a hostile index."""
    raw = _read_small(directory, INDEX, MAX_INDEX)
    if raw is None:
        try:
            return None, unindexed_shards(os.listdir(directory))
        except OSError as exc:
            raise WeightsError(f"{directory}: {_why(exc)}") from None
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


def describe(
    directory: pathlib.Path, *, hash_shards: bool = False, on_bytes: Callable[[int], None] | None = None
) -> dict:
    """The record of a model directory (see the module docstring). Raises WeightsError (never an OSError)."""
    directory = pathlib.Path(directory)
    problem = directory_problem(directory)
    if problem:
        raise WeightsError(f"{directory}: {problem}")
    config = _read_small(directory, "config.json", MAX_SMALL)
    if config is None:
        raise WeightsError(f"{directory} has no config.json")
    tag = _read_small(directory, "quantization.txt", MAX_TAG)
    hf_quant = _read_small(directory, "hf_quant_config.json", MAX_SMALL)
    total, names = shard_list(directory)
    shards: list[dict[str, Any]] = []
    for name in names:
        found = open_regular(directory, name)
        if found is None:
            raise WeightsError(f"{INDEX} names {name}, which is not in {directory}")
        shards.append({"name": name, "size": found[1].st_size})
    if hash_shards:
        for s in shards:
            found = open_regular(directory, s["name"])
            if found is None:  # removed since it was listed
                raise WeightsError(f"{s['name']} went away from {directory} while it was being described")
            s["sha256"] = sha256_file(found[0], s["size"], on_bytes)
    return {
        "config_sha256": hashlib.sha256(config).hexdigest(),
        "quantization": quant_method(tag) if tag is not None else None,
        "hf_quant_config_sha256": hashlib.sha256(hf_quant).hexdigest() if hf_quant is not None else None,
        "total_size": total,
        "shards": shards,
    }


def directory_problem(directory: pathlib.Path) -> str | None:
    """Why ``directory`` cannot be the weights directory (None when it can)."""
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        return "no such directory"
    except OSError as exc:
        return _why(exc)
    return None if stat.S_ISDIR(st.st_mode) else "not a directory"


@dataclass(frozen=True)
class Mismatch:
    file: str
    expected: str
    found: str

    def message(self) -> str:
        return f"{self.file}: the manifest records {self.expected}, the node has {self.found}"


def check(
    directory: pathlib.Path, record: dict, *, verify_hashes: bool = False, on_bytes: Callable[[int], None] | None = None
) -> list[Mismatch]:
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

    problem = directory_problem(directory)
    if problem:
        return [Mismatch(str(directory), "a weights directory", problem)]
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
            out.append(
                Mismatch(
                    "quantization.txt",
                    f"tag {want_q}" if want_q else "no tag",
                    f"tag {found_q}" if tag is not None else "no quantization.txt",
                )
            )
    hq, err = small("hf_quant_config.json", MAX_SMALL)
    want_h = record.get("hf_quant_config_sha256")
    found_h = hashlib.sha256(hq).hexdigest() if hq is not None else None
    if err:
        out.append(Mismatch("hf_quant_config.json", f"sha256 {want_h}", err))
    elif found_h != want_h:
        out.append(
            Mismatch(
                "hf_quant_config.json",
                f"sha256 {want_h}" if want_h else "no file",
                f"sha256 {found_h}" if found_h else "no such file",
            )
        )
    for shard in (record.get("shards") or [])[:MAX_SHARDS]:
        entry = shard if isinstance(shard, dict) else {}  # a record's shard that is no object names no file
        name, size = entry.get("name"), entry.get("size")
        try:
            if not isinstance(name, str):
                raise WeightsError(shard_name_problem(name))
            found = open_regular(directory, name)
        except (WeightsError, OSError) as exc:
            out.append(Mismatch(str(name)[:255], f"{size} bytes", str(exc)))
            continue
        if found is None:
            out.append(Mismatch(name, f"{size} bytes", "no such file"))
        elif found[1].st_size != size:
            out.append(Mismatch(name, f"{size} bytes", f"{found[1].st_size} bytes"))
        elif verify_hashes and entry.get("sha256"):
            try:
                digest = sha256_file(found[0], found[1].st_size, on_bytes)
            except (WeightsError, OSError) as exc:
                out.append(Mismatch(name, f"sha256 {entry['sha256']}", str(exc)))
                continue
            if digest != entry["sha256"]:
                out.append(Mismatch(name, f"sha256 {entry['sha256']}", f"sha256 {digest}"))
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


# -- the plan's expectation (domain/weights_expect.py), checked whatever way the manifest was registered ---------------

# The local checkpoint's layout digest, from its safetensors headers (service/tensor_readers.py ``directory_layout``,
# what the agent uses): returns the digest, None when the directory holds no safetensors checkpoint (a mismatch when
# the plan expects a layout), raises LayoutUnreadable naming the file whose header is hostile or broken.
LayoutReader = Callable[[pathlib.Path], str | None]


class LayoutUnreadable(WeightsError):
    """A safetensors header that cannot be read as a layout (too long, not JSON, offsets out of the file, …)."""

    def __init__(self, file: str, why: str):
        super().__init__(f"{file}: {why}")
        self.file, self.why = file, why


def no_layout_reader(directory: pathlib.Path) -> str | None:
    """A reader that finds no safetensors checkpoint (tests of the other checks)."""
    return None


def _config_digest_on_disk(directory: pathlib.Path) -> tuple[str | None, str | None]:
    """(config.json's canonical digest, None) or (None, why it has none): read bounded (MAX_SMALL, a regular file
    only), parsed as JSON, digested as domain/weights_expect.py defines it."""
    from ..domain.weights_expect import config_digest

    try:
        raw = _read_small(directory, "config.json", MAX_SMALL)
    except WeightsError as exc:
        return None, str(exc).removeprefix("config.json: ")
    if raw is None:
        return None, "no such file"
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return None, f"not JSON ({str(exc)[:120]})"
    digest = config_digest(parsed)
    return (digest, None) if digest is not None else (None, "JSON with no canonical form (NaN, Infinity or too deep)")


def _tag_on_disk(directory: pathlib.Path) -> tuple[str | None, str | None]:
    """(quantization.txt's method or ``none`` — no file is none —, None) or (None, why it cannot be read)."""
    try:
        raw = _read_small(directory, "quantization.txt", MAX_TAG)
        if raw is None:
            return "none", None
        return quant_method(raw) or "none", None
    except WeightsError as exc:
        return None, str(exc).removeprefix("quantization.txt: ")


def check_expected(
    directory: pathlib.Path, expected: dict, *, layout_reader: LayoutReader = no_layout_reader
) -> tuple[list[Mismatch], list[str]]:
    """Compare the weights directory with the plan's ``weights_expected`` claim (already checked for shape):
    config.json's canonical digest, the quantization tag (no quantization.txt: none) and, when the plan carries one
    and the local headers can be read, the layout digest. Returns (mismatches, notes: what was not compared and
    why). Hostile files are mismatches naming the file, never an exception."""
    directory = pathlib.Path(directory)
    problem = directory_problem(directory)
    if problem:
        return [Mismatch(str(directory), "a weights directory", problem)], []
    out: list[Mismatch] = []
    notes: list[str] = []
    want = expected.get("config_digest")
    if want is not None:
        found, why = _config_digest_on_disk(directory)
        if found != want:
            out.append(
                Mismatch("config.json", f"config digest {want}", f"config digest {found}" if found else str(why))
            )
    else:
        notes.append("config.json not compared (the registered config has no canonical digest)")
    want_q = expected.get("quantization") or "none"
    found_q, why = _tag_on_disk(directory)
    if found_q != want_q:
        out.append(
            Mismatch(
                "quantization.txt",
                f"tag {want_q}" if want_q != "none" else "no tag",
                f"tag {found_q}" if found_q is not None else f"an unreadable tag ({why})",
            )
        )
    layout = expected.get("layout_digest")
    if layout is not None:
        try:
            found_l = layout_reader(directory)
        except LayoutUnreadable as exc:
            out.append(Mismatch(exc.file, f"layout digest {layout}", f"headers that cannot be read ({exc.why})"))
        except (WeightsError, OSError) as exc:  # a reader's other failure: the headers could not be read
            out.append(
                Mismatch("safetensors headers", f"layout digest {layout}", f"headers that cannot be read ({exc})"[:300])
            )
        else:
            if found_l is None:  # the manifest's checkpoint has safetensors tensors; this directory has none
                out.append(Mismatch("safetensors headers", f"layout digest {layout}", "no safetensors checkpoint"))
            elif found_l != layout:
                out.append(Mismatch("safetensors headers", f"layout digest {layout}", f"layout digest {found_l}"))
    return out, notes
