"""The agent's side of the HTTP protocol (httpx) and its state file."""

from __future__ import annotations

import json
import math
import os
import pathlib
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from .files import UnsafeFile, read_file
from .trust import write_atomic

STATE_VERSION = 2
MAX_STATE_BYTES = 64 << 20  # a plan (at most 1 MiB as fetched) and up to 200 undelivered reports


class StateCorrupt(Exception):
    """The state file exists but cannot be used."""


def _opt(v: Any, kind: type | tuple) -> bool:
    return v is None or (isinstance(v, kind) and not isinstance(v, bool))


@dataclass
class AgentState:
    """Persisted between boots (written atomically): the last plan this node verified — its ``seq`` (replay
    protection: a lower seq never runs), id, ETag and JWS (run again at the next boot) — and ``verified_at``, when the
    service last confirmed it current with a freshness statement (bounds an offline boot). ``pending``: reports the
    agent could not deliver yet (an offline boot), sent once the service answers again. ``facts_drifted``: a boot
    check found the GPUs differing and the agent sent what nvidia-smi showed; the next boot whose checks pass sends
    the facts again, so a GPU that came back is counted again."""

    path: pathlib.Path
    last_seq: int = 0
    etag: str | None = None
    plan_id: str | None = None
    plan: str | None = None
    verified_at: float | None = None
    pending: list = field(default_factory=list)
    facts_drifted: bool = False  # this agent sent drifted facts (a boot check refused): resend when the GPUs agree

    @classmethod
    def load(cls, path: pathlib.Path) -> AgentState:
        """A missing file is a new node (an empty state). Raises StateCorrupt for anything unusable."""
        path = pathlib.Path(path)
        try:  # never through a symlink, only a regular file, bounded (agent/files.py)
            text = read_file(path, limit=MAX_STATE_BYTES, what="the state file").decode("utf-8")
        except FileNotFoundError:
            return cls(path=path)
        except UnsafeFile as exc:
            raise StateCorrupt(str(exc)) from None
        except OSError as exc:
            raise StateCorrupt(f"cannot read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise StateCorrupt(f"{path} is not UTF-8 text") from None
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise StateCorrupt(f"{path} is not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise StateCorrupt(f"{path} does not hold a JSON object")
        checks = {
            "last_seq": lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**53,
            "etag": lambda v: _opt(v, str),
            "plan_id": lambda v: _opt(v, str),
            "plan": lambda v: _opt(v, str),
            "verified_at": lambda v: (
                v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
            ),
            "pending": lambda v: isinstance(v, list),
            "facts_drifted": lambda v: isinstance(v, bool),
        }
        defaults = {"last_seq": 0, "pending": [], "facts_drifted": False}
        values = {}
        for name, ok in checks.items():
            v = data.get(name, defaults.get(name))
            if not ok(v):
                raise StateCorrupt(f"{path}: {name!r} has the wrong type or range ({json.dumps(v)[:60]})")
            values[name] = v
        if values["plan"] is not None and values["plan_id"] is None:
            raise StateCorrupt(f"{path}: a saved plan without its plan_id")
        return cls(path=path, **values)

    def save(self) -> None:
        data = {k: v for k, v in asdict(self).items() if k != "path"}
        write_atomic(self.path, {"version": STATE_VERSION, **data})

    def set_aside(self, why: str = "corrupt", now: float | None = None) -> pathlib.Path:
        """Move the state file out of the way (kept for inspection) as ``NAME.<why>-<UTC time>`` (``now``, default
        the machine's time): ``corrupt`` when it was unusable, ``reset`` for ``preflight agent reset``. Returns where
        it went (a link is moved, never followed)."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        dest = self.path.with_name(f"{self.path.name}.{why}-{stamp}")
        n = 1
        while os.path.lexists(dest):  # two in the same second: never overwrite an earlier copy
            n += 1
            dest = self.path.with_name(f"{self.path.name}.{why}-{stamp}-{n}")
        self.path.replace(dest)
        return dest


MAX_RESPONSE_BYTES = 1 << 20  # a plan is a few kB, the key-set chain a few kB per version


class ResponseTooLarge(ValueError):
    """The server sent more than MAX_RESPONSE_BYTES (read no further)."""


def read_body(r: httpx.Response, url: str, *, max_bytes: int, start: float, deadline: float) -> bytes:
    """The raw body of a streamed response, at most ``max_bytes`` (ResponseTooLarge beyond) and complete within
    ``deadline`` seconds of ``start`` (httpx.ReadTimeout after: a server that drips bytes is not waited on)."""
    body = bytearray()
    for chunk in r.iter_raw():
        body += chunk
        if len(body) > max_bytes:
            raise ResponseTooLarge(f"{url}: the response exceeds {max_bytes} bytes")
        if time.monotonic() - start > deadline:
            raise httpx.ReadTimeout(f"{url}: no complete answer within {deadline:.0f} s", request=r.request)
    return bytes(body)


class AgentClient:
    def __init__(
        self, server: str, node: str, token: str, *, transport: httpx.BaseTransport | None = None, timeout: float = 30.0
    ):
        self.node = node
        self.http = httpx.Client(
            base_url=server.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
        )
        self._lock = threading.Lock()
        self.timeout = timeout
        self.deadline = 2 * timeout  # a whole response, headers and body

    def _get(self, url: str, *, deadline: float | None = None, **kw) -> httpx.Response:
        """GET reading at most MAX_RESPONSE_BYTES of body (a hostile server cannot exhaust the node's memory), within
        one overall deadline (a server that drips bytes is treated as unreachable, not waited on for ever), and
        without content decoding (a compressed body could expand far beyond the limit before it is counted)."""
        start = time.monotonic()
        limit = deadline if deadline is not None else self.deadline
        headers = {**kw.pop("headers", {}), "Accept-Encoding": "identity"}
        with self.http.stream("GET", url, headers=headers, **kw) as r:
            if r.headers.get("content-encoding", "identity").lower() not in ("identity", ""):
                raise ResponseTooLarge(f"{url}: a {r.headers['content-encoding']} response was not asked for")
            body = read_body(r, url, max_bytes=MAX_RESPONSE_BYTES, start=start, deadline=limit)
            return httpx.Response(r.status_code, headers=r.headers, content=body, request=r.request)

    def keysets(self, after: int) -> list | None:
        """The key-set statements above version ``after`` (to be verified by the caller: never trusted as sent);
        None when the answer is not a list of them."""
        r = self._get("/v1/keysets", params={"after": after})
        if r.status_code == 404:
            return []  # a service without a key-set chain: nothing to apply
        r.raise_for_status()  # 5xx: treated as unreachable by the caller
        try:
            body = r.json()
        except (ValueError, RecursionError):  # not JSON, or nested beyond the parser's depth
            return None  # refused by Trust.apply_chain as malformed
        return body.get("keysets") if isinstance(body, dict) else None

    def audit_checkpoint(self) -> str | None:
        """The service's newest signed audit checkpoint (compact JWS, to be verified by the caller); ``""`` when the
        service says it has none (404); None when the answer is not one."""
        r = self._get("/v1/audit/checkpoints/latest")
        if r.status_code == 404:
            return ""
        if r.status_code != 200:
            return None
        try:
            body = r.json()
        except (ValueError, RecursionError):  # not JSON, or nested beyond the parser's depth
            return None
        token = body.get("checkpoint") if isinstance(body, dict) else None
        return token if isinstance(token, str) else None

    def fetch(self, etag: str | None = None, wait: int = 0, nonce: str | None = None) -> httpx.Response:
        """GET the node's plan; with ``wait`` the server holds the call until the plan changes (long poll); with
        ``nonce`` (X-Plan-Nonce) the freshness statement served must echo it (agent/verify.py)."""
        # the ETag comes from the state file or a server's header: one HTTP cannot carry (not visible ASCII) is
        # left out (the plan is then fetched whole) rather than failing every fetch
        usable = etag is not None and etag.isascii() and etag.isprintable() and len(etag) <= 256
        headers = {"If-None-Match": etag} if usable and etag else {}
        if nonce is not None:
            headers["X-Plan-Nonce"] = nonce
        params = {"wait": wait} if wait else {}
        return self._get(
            f"/v1/nodes/{self.node}/plan",
            headers=headers,
            params=params,
            timeout=self.timeout + wait if wait else self.http.timeout,
            deadline=self.deadline + wait,
        )

    def post_metrics(self, body: dict) -> httpx.Response:
        """One window of vLLM's live metrics (agent/vllm_metrics.py) for the tuning loop."""
        return self.http.post(f"/v1/nodes/{self.node}/metrics", json=body)

    def put_facts(self, facts: dict) -> httpx.Response:
        """This node's hardware facts as nvidia-smi shows them (the agent's token may update only its own node)."""
        return self.http.put(f"/v1/nodes/{self.node}/facts", json=facts)

    def post_report(self, body: dict) -> httpx.Response:
        return self.http.post(f"/v1/nodes/{self.node}/reports", json=body)

    def report(self, plan_id: str | None, status: str, message: str | None = None, details: dict | None = None) -> bool:
        """Best effort: True when the service stored it (the verdict on a plan never depends on it)."""
        try:
            with self._lock:
                r = self.post_report(
                    {"plan_id": plan_id, "status": status, "message": message, "details": details or {}}
                )
            return r.status_code == 201
        except httpx.HTTPError:
            return False
