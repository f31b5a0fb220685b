"""Real processes for the end-to-end and browser tests: the service under uvicorn on a free port, and an admin
client for it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import uvicorn

from service.clock import SYSTEM, Clock
from tests.support import ADMIN, model_config

PY = sys.executable
PREFLIGHT = os.path.join(os.path.dirname(PY), "preflight")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(db_url: str, data_dir, port: int) -> subprocess.Popen:
    env = {
        **os.environ,
        "PREFLIGHT_DATABASE_URL": db_url,
        "PREFLIGHT_DATA_DIR": str(data_dir),
        "PREFLIGHT_ADMIN_TOKEN": ADMIN,
    }
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "uvicorn",
            "service.api.main:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 90  # a loaded two-core machine takes that long to import the service
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server did not start: {proc.stderr.read().decode()[-2000:]}")


class ThreadServer:
    """The service under uvicorn in a thread of the test process: the same app ``service.api.main`` builds from the
    environment, on a free port, without a second interpreter to start (what a test of the agent needs: a real HTTP
    service; processes are for tests about processes)."""

    def __init__(self, db_url: str, data_dir, port: int, clock: Clock = SYSTEM):
        from service.api.app import create_app
        from service.settings import Settings

        app = create_app(Settings(database_url=db_url, data_dir=data_dir, admin_token=ADMIN), clock=clock)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn-{port}", daemon=True)

    def start(self, timeout: float = 60) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)


class Behind:
    """The machine's clock, ``seconds`` behind in wall time: a service on it signs what it signs now as if it had
    signed it that long ago (a captured answer replayed later), with no test waiting for the time to pass."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def time(self) -> float:
        return SYSTEM.time() - self.seconds

    def monotonic(self) -> float:
        return SYSTEM.monotonic()

    def sleep(self, seconds: float) -> None:
        SYSTEM.sleep(seconds)


def admin(url) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)


def setup_fleet(c: httpx.Client, nodes: list[str]) -> dict[str, str]:
    tokens = {}
    for n in nodes:
        r = c.post("/v1/nodes", json={"name": n, "gpu": "h100-sxm-80gb", "gpu_count": 8, "interconnect": "nvlink"})
        assert r.status_code == 201, r.text
        tokens[n] = r.json()["agent_token"]
    r = c.post(
        "/v1/manifests",
        json={
            "name": "meta-llama/Llama-3.1-8B",
            "version": "1",
            "uri": "s3://llama-8b",
            "config": model_config("meta-llama__Meta-Llama-3.1-8B"),
        },
    )
    assert r.status_code == 201, r.text
    return tokens
