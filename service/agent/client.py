"""The agent's side of the HTTP protocol (httpx) and its state file (last accepted seq, ETag)."""

from __future__ import annotations

import json
import os
import pathlib
from dataclasses import dataclass

import httpx


@dataclass
class AgentState:
    """Persisted between boots: the highest ``seq`` accepted and the ETag of that plan (rollback protection)."""

    path: pathlib.Path
    last_seq: int = 0
    etag: str | None = None
    plan_id: str | None = None

    @classmethod
    def load(cls, path: pathlib.Path) -> "AgentState":
        if path.exists():
            data = json.loads(path.read_text())
            return cls(path=path, last_seq=int(data.get("last_seq", 0)), etag=data.get("etag"),
                       plan_id=data.get("plan_id"))
        return cls(path=path)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"last_seq": self.last_seq, "etag": self.etag, "plan_id": self.plan_id}))
        os.replace(tmp, self.path)


class AgentClient:
    def __init__(self, server: str, node: str, token: str, *, transport: httpx.BaseTransport | None = None,
                 timeout: float = 30.0):
        self.node = node
        self.http = httpx.Client(base_url=server.rstrip("/"), headers={"Authorization": f"Bearer {token}"},
                                 timeout=timeout, transport=transport)

    def jwks(self) -> dict:
        r = self.http.get("/.well-known/jwks.json")
        r.raise_for_status()
        return r.json()

    def fetch(self, etag: str | None = None, wait: int = 0) -> httpx.Response:
        """GET the node's plan; with ``wait`` the server holds the call until the plan changes (long poll)."""
        headers = {"If-None-Match": etag} if etag else {}
        params = {"wait": wait} if wait else {}
        return self.http.get(f"/v1/nodes/{self.node}/plan", headers=headers, params=params,
                             timeout=self.http.timeout.read + wait if wait else self.http.timeout)

    def report(self, plan_id: str, status: str, message: str | None = None, details: dict | None = None) -> None:
        try:
            self.http.post(f"/v1/nodes/{self.node}/reports",
                           json={"plan_id": plan_id, "status": status, "message": message, "details": details or {}})
        except httpx.HTTPError:
            pass  # reporting is best effort; the verdict on the plan does not depend on it
