"""Database outage: requests get 503 problem+json with Retry-After, and the service recovers without a restart."""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.clock import ManualClock
from service.db.session import Database
from service.services import epochs
from tests.support import ADMIN
from tests.support.api import register_manifest, register_node


class TcpProxy:
    """A loopback TCP forwarder that can refuse connections (outage) and come back."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.up = True
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def outage(self):
        self.up = False
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass
        self.conns.clear()

    def restore(self):
        self.up = True

    def close(self):
        """Stop listening and cut every connection (nothing of this test outlives it)."""
        self.up = False
        try:
            self.sock.close()
        except OSError:
            pass
        self.outage()


def assert_503(r):
    assert r.status_code == 503, r.text
    assert r.headers["content-type"] == "application/problem+json" and r.headers["retry-after"]


def test_postgres_outage_then_recovery(db_url, settings, keys):
    if not db_url.startswith("postgresql"):
        pytest.skip("needs PostgreSQL (CI sets PREFLIGHT_TEST_DATABASE_URL)")
    u = urlsplit(db_url)
    proxy = TcpProxy((u.hostname, u.port or 5432))
    proxied = db_url.replace(f"{u.hostname}:{u.port or 5432}", f"127.0.0.1:{proxy.port}")
    db = Database(proxied)
    app = create_app(settings, db=db, keys=keys, clock=ManualClock())
    try:
        _outage_then_recovery(app, proxy)
    finally:
        db.engine.dispose()
        proxy.close()


def _outage_then_recovery(app, proxy):
    with TestClient(app) as c:
        c.headers["Authorization"] = f"Bearer {ADMIN}"
        assert c.get("/readyz").status_code == 200
        # an agent whose plan and token are cached in this process
        register_manifest(c)
        agent = {"Authorization": "Bearer " + register_node(c, name="gpu-01")["agent_token"]}
        plan = c.post(
            "/v1/plans",
            json={
                "manifest": "meta-llama/Llama-3.1-70B@1",
                "nodes": ["gpu-01"],
                "engine_args": {"tensor_parallel_size": 8, "max_model_len": 8192},
            },
        ).json()
        assert c.get("/v1/nodes/gpu-01/plan", headers=agent).status_code == 200
        proxy.outage()
        assert_503(c.get("/readyz"))
        assert_503(c.get("/v1/nodes"))
        assert_503(c.post("/v1/nodes", json={"name": "n1", "gpu": "h100-sxm-80gb", "gpu_count": 8}))
        # the agents' paths: group-committed writes fail with 503, and once the cache-epoch poll has failed for
        # STALE_AFTER nothing is answered from memory either
        assert_503(c.post("/v1/nodes/gpu-01/reports", headers=agent, json={"plan_id": plan["id"], "status": "fetched"}))
        assert app.state.epochs.wait_for_poll(timeout=30)  # a poll that met the outage
        app.state.clock.advance(epochs.STALE_AFTER + 1)
        assert_503(c.get("/v1/nodes/gpu-01/plan", headers=agent))
        proxy.restore()
        assert c.get("/readyz").status_code == 200
        assert c.post("/v1/nodes", json={"name": "n1", "gpu": "h100-sxm-80gb", "gpu_count": 8}).status_code == 201
        assert c.get("/v1/nodes/gpu-01/plan", headers=agent).status_code == 200
        assert (
            c.post(
                "/v1/nodes/gpu-01/reports", headers=agent, json={"plan_id": plan["id"], "status": "fetched"}
            ).status_code
            == 201
        )
