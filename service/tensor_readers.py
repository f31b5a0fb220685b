"""A checkpoint's tensor inventory (service/domain/tensors.py) read from where the checkpoint is: a local model
directory (``preflight manifest push DIR``, a Hugging Face cache snapshot) or a Hub repository by HTTP range reads.

Which files: the ones vLLM loads. With ``model.safetensors.index.json``, the files its ``weight_map`` names (vllm
0.33.0 vllm/model_executor/model_loader/weight_utils.py:590-616 ``filter_duplicate_safetensors_files``; a file it
names that is missing is an error there too, :609-613); without one, every ``*.safetensors`` in the directory
(default_loader.py:185-186 ``allow_patterns = ["*.safetensors", …]``, :229-230 ``glob`` of the top folder;
weight_utils.py:596-597: the index filters only when there is one). On the Hub, that directory is the repository's
top folder as its tree API lists it at the pinned commit (vLLM lists it too: weight_utils.py:471-476 ``fs.ls``).

Only headers are read: 8 bytes and ``N`` of JSON per file, never a weight. Files are opened the way the node agent
opens them (service/agent/weights.py ``open_regular``: plain names only, symlinks only inside the directory or to the
blobs of a Hugging Face cache snapshot, regular files only), so a hostile directory is a TensorsError naming the
file, never an OSError.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import quote, urlsplit

from .agent import weights
from .domain.tensors import (
    INDEX,
    MAX_HEADER_BYTES,
    MAX_INDEX_BYTES,
    FileHeader,
    Inventory,
    SafetensorsIndex,
    TensorsError,
    build_inventory,
    parse_header,
    parse_index,
    read_header,
)

SUFFIX = weights.SUFFIX
T = TypeVar("T")
FIRST_READ = 100_000  # bytes of a shard asked for first: most headers fit (huggingface_hub does the same)


def _shard_files(index: SafetensorsIndex | None, listing: list[str] | None, where: str) -> list[str]:
    """The files to read: the index's, else every ``*.safetensors`` of ``listing`` (``weights.unindexed_shards``,
    vLLM's rule), each a plain name."""
    if index is None:
        try:
            files = weights.unindexed_shards(listing or [])
        except weights.WeightsError as exc:
            raise TensorsError(where, str(exc), rule="safetensors_index") from None
    else:
        files = list(index.files)
        if len(files) > weights.MAX_SHARDS:
            raise TensorsError(INDEX, f"names more than {weights.MAX_SHARDS} shard files")
        for name in files:
            problem = weights.shard_name_problem(name)
            if problem:
                raise TensorsError(INDEX, problem, rule="safetensors_index")
    if not files:
        raise TensorsError(
            where, f"holds no {INDEX} and no *{SUFFIX} file (not a safetensors checkpoint)", rule="safetensors_absent"
        )
    return files


def _local_header(directory: pathlib.Path, name: str) -> FileHeader:
    try:
        found = weights.open_regular(directory, name)
        if found is None:
            raise TensorsError(name, f"{INDEX} names it, but it is not in {directory}")
        real, st = found
        fd = weights._open_fd(real, name)
    except weights.WeightsError as exc:
        raise TensorsError(name, str(exc).removeprefix(f"{name}: ")) from None
    try:
        with os.fdopen(fd, "rb") as fh:
            return read_header(fh, name, file_size=st.st_size)
    except OSError as exc:
        raise TensorsError(name, exc.strerror or exc.__class__.__name__) from None


def read_directory(directory: pathlib.Path) -> Inventory:
    """The inventory of a local model directory (or a Hugging Face cache snapshot). Raises TensorsError."""
    directory = pathlib.Path(directory)
    problem = weights.directory_problem(directory)
    if problem:
        raise TensorsError(str(directory), problem)
    try:
        raw = weights._read_small(directory, INDEX, MAX_INDEX_BYTES)
        listing = None if raw is not None else os.listdir(directory)
    except weights.WeightsError as exc:
        raise TensorsError(INDEX, str(exc).removeprefix(f"{INDEX}: "), rule="safetensors_index") from None
    except OSError as exc:
        raise TensorsError(str(directory), exc.strerror or exc.__class__.__name__) from None
    index = parse_index(raw) if raw is not None else None
    files = _shard_files(index, listing, str(directory))
    return build_inventory([_local_header(directory, name) for name in files], index)


def _offline() -> bool:
    from huggingface_hub import constants

    # huggingface_hub reads HF_HUB_OFFLINE once, at import; read it again (a deploy script may set it later)
    return constants.is_offline_mode() or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+)")
# A commit of a Hub repository: what a resolve answer's X-Repo-Commit names (huggingface_hub 2.4.0
# file_download.py:1677 reads it, :1792 refuses an answer without it) and what a revision pinned to it looks like.
COMMIT = re.compile(r"[0-9a-f]{40}")
# The small files a manifest records, each with the bound the node agent reads it with (agent/weights.py).
HUB_SMALL = {
    "config.json": weights.MAX_SMALL,
    "quantization.txt": weights.MAX_TAG,
    "hf_quant_config.json": weights.MAX_SMALL,
}


# The Hub's file list (``_Hub.files``): entries of the top folder read at most (vLLM loads at most MAX_SHARDS
# files; a top folder of ten thousand entries is no model repository), bytes of one page, pages.
MAX_LISTED = 10_000
MAX_LISTING_BYTES = 16 << 20
MAX_PAGES = 100


def _listed_file(entry: object, where: str) -> str | None:
    """The name of a file of the top folder the tree API lists (None for a folder, or a subfolder's file); a
    path that is not plain names joined by ``/`` is refused (``../x.safetensors`` names no file of the
    repository)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) or entry.get("type") not in KINDS:
        raise TensorsError(where, f"an entry that is not a file or folder: {str(entry)[:120]}")
    path = entry["path"]
    for part in path.split("/"):
        problem = weights.shard_name_problem(part)
        if problem:
            raise TensorsError(where, f"lists {path[:120]!r}: {problem.replace('shard name', 'name')}")
    return path if entry["type"] == "file" and "/" not in path else None


KINDS = ("file", "directory")  # an entry's "type" (hf_api.py:4029)


class _Hub:
    """HTTP range reads of one repository's files through huggingface_hub's session, URLs and headers
    (``HF_ENDPOINT``, the token, its offline switch): bounded, whatever the server answers — at most the bytes
    asked for, at most ``timeout`` seconds per file in all (a server that drips bytes is cut off too), no redirect
    from https to http; the token is not sent to another origin (httpx drops it on a cross-origin redirect)."""

    def __init__(
        self, repo_id: str, revision: str | None, token: str | bool | None, timeout: float, endpoint: str | None = None
    ):
        from huggingface_hub import constants, hf_hub_url
        from huggingface_hub.utils import build_hf_headers, get_session

        self.repo_id, self.revision, self.timeout = repo_id, revision, timeout
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
        self.url = lambda name: hf_hub_url(repo_id, name, revision=self.revision, endpoint=self.endpoint)
        self.headers = {**build_hf_headers(token=token), "Accept-Encoding": "identity"}  # sizes as stored
        self.session = get_session()
        self.commit: str | None = None  # the X-Repo-Commit of the first answer that names one

    def get(self, name: str, first: int, last: int, max_size: int | None = None) -> tuple[bytes, int | None] | None:
        """Bytes ``first..last`` (inclusive) of ``name`` and the file's size when the server says it; None for a
        404. Reads at most ``last - first + 1`` bytes even from a server that ignores the range; gives up after
        ``timeout`` seconds in all."""
        return self._in_time(name, lambda: self._get(name, first, last, max_size))

    def _in_time(self, name: str, read: Callable[[], T]) -> T:
        """``read()``, given up after ``timeout`` seconds in all (it runs in a daemon thread: httpx's timeouts bound
        each read, not a server that sends one byte at a time)."""
        result: list = []

        def run() -> None:
            try:
                result.append(read())
            except BaseException as exc:  # handed to the caller's thread
                result.append(exc)

        worker = threading.Thread(target=run, name=f"hub-read-{name[:40]}", daemon=True)
        worker.start()
        worker.join(self.timeout)
        if not result:
            raise TensorsError(f"{self.repo_id}/{name}", self._late())
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]

    def _get(self, name: str, first: int, last: int, max_size: int | None) -> tuple[bytes, int | None] | None:
        from huggingface_hub.errors import EntryNotFoundError
        from huggingface_hub.utils import hf_raise_for_status

        headers = {**self.headers, "Range": f"bytes={first}-{last}"}
        limit = last - first + 1
        where = f"{self.repo_id}/{name}"
        try:
            with (
                self._named(where),
                self.session.stream(
                    "GET", self.url(name), headers=headers, timeout=self.timeout, follow_redirects=True
                ) as r,
            ):
                self._check_chain(r, where)
                # a missing file; a missing repository or revision is named by hf_raise_for_status below
                if r.status_code == 404 and r.headers.get("x-error-code", "EntryNotFound") == "EntryNotFound":
                    return None
                hf_raise_for_status(r)
                if r.status_code not in (200, 206):
                    raise TensorsError(where, f"HTTP {r.status_code} from {r.url.host}: not a file's bytes")
                got = _CONTENT_RANGE.fullmatch(r.headers.get("content-range", "").strip())
                size = int(got.group(3)) if got else None
                if r.status_code == 200:  # the whole file: skip to ``first``
                    size = int(r.headers["content-length"]) if r.headers.get("content-length", "").isdigit() else None
                if max_size is not None and size is not None and size > max_size:
                    return b"", size  # too large as announced: not read
                body = bytearray()
                for chunk in r.iter_bytes():
                    body += chunk
                    if len(body) >= (limit if r.status_code == 206 else first + limit):
                        break
                data = bytes(body[:limit] if r.status_code == 206 else body[first : first + limit])
                return data, size
        except EntryNotFoundError:
            return None

    @contextmanager
    def _named(self, where: str) -> Iterator[None]:
        """Whatever goes wrong in an answer as a TensorsError naming ``where``: an error answer as the Hub means it,
        httpx's transport errors and the offline switch by name, never a traceback."""
        from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

        try:
            yield
        except (TensorsError, EntryNotFoundError):
            raise
        except HfHubHTTPError as exc:
            raise TensorsError(where, _http_problem(exc, self.endpoint)) from None
        except Exception as exc:
            if exc.__class__.__name__.endswith("Timeout"):  # httpx's per-read timeout: the same as the deadline's
                raise TensorsError(where, self._late()) from None
            raise TensorsError(where, f"{exc.__class__.__name__}: {str(exc)[:200]}") from None

    def files(self) -> list[str]:
        """The names of the files in the repository's top folder at ``revision``, as the Hub's tree API lists them
        (huggingface_hub 2.4.0 hf_api.py:4018-4025 ``_iter_repo_tree_pages``: GET
        ``{endpoint}/api/models/{repo}/tree/{revision}``, not recursive; further pages linked by a ``Link: <…>;
        rel="next"`` header, utils/_pagination.py:68-69). Bounded as a file is (``timeout`` in all, MAX_LISTING_BYTES
        a page, MAX_LISTED entries, next pages only from the endpoint's origin); a name with ``..``, a control or
        invisible character is refused; a subfolder's files are not listed (vLLM reads none)."""
        return self._in_time("(file list)", self._files)

    def _files(self) -> list[str]:
        where = f"{self.repo_id} (file list at {self.revision or 'main'})"
        url: str | None = f"{self.endpoint}/api/models/{self.repo_id}/tree/{quote(self.revision or 'main', safe='')}"
        params: dict | None = {"recursive": "false", "expand": "false"}
        names: dict[str, None] = {}
        listed = 0
        for _ in range(MAX_PAGES):
            if url is None:
                return list(names)
            page, url = self._page(url, params, where)
            params = None  # the next link carries its own
            listed += len(page)
            if listed > MAX_LISTED:
                raise TensorsError(where, f"lists more than {MAX_LISTED} entries in the repository's top folder")
            for entry in page:
                name = _listed_file(entry, where)
                if name is not None:
                    names[name] = None
        if url is not None:
            raise TensorsError(where, f"more than {MAX_PAGES} pages: refused")
        return list(names)

    def _page(self, url: str, params: dict | None, where: str) -> tuple[list, str | None]:
        """One page of the tree API's answer (a JSON array) and the next page's URL (None on the last page)."""
        from huggingface_hub.utils import hf_raise_for_status

        with (
            self._named(where),
            self.session.stream(
                "GET", url, params=params, headers=self.headers, timeout=self.timeout, follow_redirects=True
            ) as r,
        ):
            self._check_chain(r, where)
            hf_raise_for_status(r)
            body = bytearray()
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > MAX_LISTING_BYTES:
                    raise TensorsError(where, f"a page of the file list over {MAX_LISTING_BYTES} bytes: refused")
            link = r.links.get("next", {}).get("url")
            following = r.url.join(link) if link else None
        nxt = str(following) if following is not None else None
        if nxt is not None and urlsplit(nxt)[:2] != urlsplit(self.endpoint)[:2]:
            raise TensorsError(where, f"the next page is at {urlsplit(nxt).netloc[:80]}, not {self.endpoint}: refused")
        try:
            page = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise TensorsError(where, f"not JSON ({str(exc)[:120]})") from None
        if not isinstance(page, list):
            raise TensorsError(where, "not a JSON array of files")
        return page, nxt

    def _late(self) -> str:
        return f"no complete answer from {self.endpoint} in {self.timeout:g} s"

    def _check_chain(self, r, where: str) -> None:
        """The answer's redirects: none from https to http (what was judged could then be anyone's); the commit
        the repository's server names (X-Repo-Commit), kept from the first answer that carries one."""
        hops = [*r.history, r]
        for before, after in zip(hops, hops[1:], strict=False):
            if before.url.scheme == "https" and after.url.scheme != "https":
                raise TensorsError(where, f"redirected from https to {after.url.scheme}://{after.url.host}: refused")
        if self.commit is None:
            named = next((h.headers["x-repo-commit"] for h in hops if "x-repo-commit" in h.headers), None)
            if named is not None:
                if not COMMIT.fullmatch(named):
                    raise TensorsError(where, f"the server names commit {named[:80]!r}, not a 40-hex commit")
                self.commit = named

    def small(self, name: str, limit: int) -> bytes | None:
        """A whole small file (None when the repository has none), refused beyond ``limit`` bytes."""
        got = self.get(name, 0, limit, limit)  # one byte more than allowed: a larger file shows itself
        if got is None:
            return None
        data, size = got
        if len(data) > limit or (size is not None and size > limit):
            raise TensorsError(
                f"{self.repo_id}/{name}", f"{size or len(data)} bytes, more than the {limit} this file may have"
            )
        return data

    def header(self, name: str) -> tuple[FileHeader, int | None]:
        """The file's header and its size (as the server says it)."""
        got = self.get(name, 0, FIRST_READ - 1)
        if got is None:
            raise TensorsError(name, f"{self.repo_id} has no such file (at revision {self.revision or 'main'})")
        data, size = got
        if len(data) >= 8:
            n = int.from_bytes(data[:8], "little")
            if n <= MAX_HEADER_BYTES and 8 + n > len(data):
                more = self.get(name, len(data), 8 + n - 1)
                data += more[0] if more else b""
        return parse_header(data, name, file_size=size), size


def _http_problem(exc, endpoint: str) -> str:
    """An error answer of the Hub as a sentence: the HTTP status and what huggingface_hub made of it (its
    X-Error-Code: utils/_http.py ``hf_raise_for_status``), with what to do about it."""
    from huggingface_hub.errors import DisabledRepoError, GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    status = getattr(getattr(exc, "response", None), "status_code", None)
    kinds = [
        (GatedRepoError, "a gated repository: accept its terms on the Hub and set HF_TOKEN"),
        (RepositoryNotFoundError, "no such repository, or a private one (set HF_TOKEN)"),
        (RevisionNotFoundError, "no such revision"),
        (DisabledRepoError, "the repository is disabled"),
    ]
    kind = next((why for cls, why in kinds if isinstance(exc, cls)), str(exc).splitlines()[0][:200])
    return f"HTTP {status} from {endpoint}: {kind}"


def inventory_record(inventory: Inventory) -> dict:
    """What ``POST /v1/manifests`` takes as ``tensors``: the inventory's summary and the format its tensors show."""
    from .domain.linear_shapes import linear_shapes
    from .domain.rank_weights import rank_weights
    from .domain.tensor_format import detect_format

    ranks = rank_weights(inventory.tensors)
    linears = linear_shapes(inventory.tensors)
    return {
        **inventory.summary(),
        "format": detect_format(inventory.tensors).as_dict(),
        **({"ranks": ranks.as_dict()} if ranks is not None else {}),
        **({"linears": [m.as_dict() for m in linears]} if linears is not None else {}),
    }


def _repo_problem(repo_id: str) -> None:
    if weights.shard_name_problem(repo_id.replace("/", "", 1)) or ".." in repo_id:
        raise TensorsError(repo_id[:200], "is not a repository id (owner/name)")


def cached_snapshot(repo_id: str, revision: str | None = None) -> pathlib.Path | None:
    """In offline mode (``HF_HUB_OFFLINE=1``), the repository's snapshot in the local Hugging Face cache (a
    directory named by its commit), TensorsError when it is not there; None when online."""
    _repo_problem(repo_id)
    if not _offline():
        return None
    from huggingface_hub import snapshot_download

    try:
        return pathlib.Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except Exception as exc:  # LocalEntryNotFoundError and kin: nothing cached
        raise TensorsError(
            repo_id, f"offline (HF_HUB_OFFLINE) and not in the Hugging Face cache: {exc.__class__.__name__}"
        ) from None


def read_hub(
    repo_id: str, *, revision: str | None = None, token: str | bool | None = None, timeout: float = 30.0
) -> Inventory:
    """The inventory of a Hub repository, from its headers read by HTTP range (``HF_ENDPOINT`` honoured). In
    offline mode (``HF_HUB_OFFLINE=1``) it is read from the local Hugging Face cache's snapshot, or refused when
    the repository is not there. Raises TensorsError."""
    snapshot = cached_snapshot(repo_id, revision)
    if snapshot is not None:
        return read_directory(snapshot)
    hub = _Hub(repo_id, revision, token, timeout)
    return _hub_tensors(hub)[0]


def _hub_tensors(hub: _Hub) -> tuple[Inventory, SafetensorsIndex | None, dict[str, int]]:
    """The inventory, the index and each shard's size, read from ``hub`` at its (pinned) revision."""
    got = hub.get(INDEX, 0, MAX_INDEX_BYTES)
    index = parse_index(got[0]) if got is not None else None
    files = _shard_files(index, hub.files() if index is None else None, hub.repo_id)
    headers, sizes = [], {}
    for name in files:
        header, size = hub.header(name)
        if size is None:
            raise TensorsError(f"{hub.repo_id}/{name}", "the server did not say the file's size (Content-Range)")
        headers.append(header)
        sizes[name] = size
    return build_inventory(headers, index), index, sizes


def _checked_small(repo_id: str, name: str, data: bytes) -> bytes:
    """``data`` when it is what ``name`` must be (a JSON object; quantization.txt: UTF-8 text), checked before any
    header is read: a sign-in page or an error document served as config.json is named at once."""
    where = f"{repo_id}/{name}"
    if name == "quantization.txt":
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise TensorsError(where, "not UTF-8 text") from None
        return data
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise TensorsError(where, f"not JSON ({str(exc)[:120]})") from None
    if not isinstance(value, dict):
        raise TensorsError(where, "not a JSON object")
    return data


@dataclass(frozen=True)
class HubCheckpoint:
    """What ``preflight manifest push --hub`` registers, read at one commit: the small files (config.json, and
    quantization.txt / hf_quant_config.json when the repository has them), the index, each shard's size, the
    inventory."""

    repo_id: str
    commit: str
    small: dict[str, bytes]
    index: SafetensorsIndex | None
    sizes: dict[str, int]
    inventory: Inventory


def read_hub_checkpoint(
    repo_id: str, *, revision: str | None = None, token: str | bool | None = None, timeout: float = 30.0
) -> HubCheckpoint:
    """A Hub repository's checkpoint at ``revision`` (default: main), pinned to the commit config.json's answer
    names (X-Repo-Commit): every other file is read at that commit, so what is recorded is one commit's, even when
    the branch moves meanwhile. Online only (see ``cached_snapshot``). Raises TensorsError naming the file."""
    _repo_problem(repo_id)
    if revision is not None and (
        not revision or len(revision) > 256 or weights.shard_name_problem(revision.replace("/", ""))
    ):
        raise TensorsError(repo_id, f"revision {revision[:80]!r} is not a branch, tag or commit name")
    hub = _Hub(repo_id, revision, token, timeout)
    config = hub.small("config.json", HUB_SMALL["config.json"])
    if config is None:
        raise TensorsError(f"{repo_id}/config.json", f"no such file (at revision {revision or 'main'})")
    if hub.commit is None and revision is not None and COMMIT.fullmatch(revision):
        hub.commit = revision
    if hub.commit is None:
        raise TensorsError(
            f"{repo_id}/config.json",
            f"the server did not say which commit revision {revision or 'main'} is (no X-Repo-Commit header)",
        )
    if revision is not None and COMMIT.fullmatch(revision) and hub.commit != revision:
        raise TensorsError(f"{repo_id}/config.json", f"asked at commit {revision}, answered from {hub.commit}")
    hub.revision = hub.commit  # every other file from the same commit
    small = {"config.json": _checked_small(repo_id, "config.json", config)}
    for name in ("quantization.txt", "hf_quant_config.json"):
        data = hub.small(name, HUB_SMALL[name])
        if data is not None:
            small[name] = _checked_small(repo_id, name, data)
    inventory, index, sizes = _hub_tensors(hub)
    return HubCheckpoint(repo_id, hub.commit, small, index, sizes, inventory)


def directory_layout(directory: pathlib.Path) -> str | None:
    """The node agent's layout reader (agent/weights.py ``LayoutReader``): the layout digest of the checkpoint in
    ``directory`` from its safetensors headers only; None when the directory holds no safetensors checkpoint;
    LayoutUnreadable naming the file (and tensor) whose header or index cannot be read as the format defines it."""
    try:
        return read_directory(directory).layout_digest
    except TensorsError as exc:
        if exc.rule == "safetensors_absent":
            return None
        where = exc.file if exc.tensor is None else f"{exc.file} (tensor {exc.tensor[:120]!r})"
        raise weights.LayoutUnreadable(where, exc.problem) from None
    except (weights.WeightsError, OSError):
        raise
    except Exception as exc:  # noqa: BLE001 - a header this reader did not foresee: refused at the node, not passed
        raise weights.LayoutUnreadable(
            str(directory), f"unreadable safetensors headers ({type(exc).__name__})"
        ) from None
