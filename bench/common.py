"""Shared helpers for the HTTP benchmarks: throw-away servers on 127.0.0.1, a scratch PostgreSQL database,
fleet seeding through the public API, /proc RSS, percentiles and tables.

Every server is started by the benchmark itself in its own process group (``preflight serve --workers N`` exactly
as in production, or ``uvicorn bench.bare_app:app`` with the same settings) and stopped by its own pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

ROOT = pathlib.Path(__file__).resolve().parent.parent
VENV_BIN = pathlib.Path(sys.executable).parent
PG_HOST, PG_USER = "127.0.0.1", "postgres"
ADMIN_TOKEN = "bench-admin-token-0123456789abcdef"
H100 = "NVIDIA H100 80GB HBM3"
FIXTURE = "meta-llama__Meta-Llama-3.1-70B"
MANIFEST = "meta-llama/Llama-3.1-70B@1"
ENGINE_ARGS = {"tensor_parallel_size": 8, "max_model_len": 8192, "gpu_memory_utilization": 0.9}


# -- numbers and tables ---------------------------------------------------------------------------------------
def pct(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


def _fmt(c) -> str:
    if isinstance(c, float):
        return f"{c:,.1f}" if abs(c) >= 10 else f"{c:.2f}"
    if isinstance(c, int):
        return f"{c:,}"
    return str(c)


# -- processes ------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    out = []
    for p in pathlib.Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            out.append(int(p.name))
    return out


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """User + system CPU seconds used so far by each process (from /proc/<pid>/stat); a gone process is left out."""
    out = {}
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            out[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return out


def _rss_kib(pid: int) -> int:
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Server:
    """A server process tree we started (own session / process group)."""

    name: str
    proc: subprocess.Popen
    port: int
    data_dir: pathlib.Path
    log_path: pathlib.Path
    env: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def workers(self) -> list[int]:
        """uvicorn's worker processes (children of the supervisor, minus multiprocessing's helpers)."""
        out = []
        for pid in _children(self.proc.pid):
            try:
                cmd = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"resource_tracker" not in cmd:
                out.append(pid)
        return out

    def cpu_seconds(self) -> float:
        """User + system CPU seconds used so far by the workers and the supervisor (from /proc/<pid>/stat)."""
        return sum(cpu_seconds([self.proc.pid, *self.workers()]).values())

    def rss_mib(self) -> tuple[float, float]:
        """(sum of the workers' RSS, supervisor's RSS) in MiB."""
        return sum(_rss_kib(p) for p in self.workers()) / 1024, _rss_kib(self.proc.pid) / 1024

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)


def _wait_ready(server: Server, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"{server.name} exited ({server.proc.returncode}); log:\n{server.log_path.read_text()[-3000:]}"
            )
        try:
            if httpx.get(server.url + "/healthz", timeout=1).status_code == 200:
                # every worker must be up, not only the first one to accept
                if len(server.workers()) >= int(server.env.get("_WORKERS", "1")):
                    return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{server.name} not ready after {timeout}s; log:\n{server.log_path.read_text()[-3000:]}")


@contextlib.contextmanager
def preflight_server(db: str, workers: int = 2, data_dir: pathlib.Path | None = None) -> Iterator[Server]:
    """``preflight serve --workers N`` on 127.0.0.1 with a throw-away data dir. ``db``: "sqlite" or a PostgreSQL URL."""
    own = data_dir is None
    data_dir = data_dir or pathlib.Path(tempfile.mkdtemp(prefix="preflight-bench-"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}
    env.update(PREFLIGHT_DATA_DIR=str(data_dir), PREFLIGHT_ADMIN_TOKEN=ADMIN_TOKEN)
    if db != "sqlite":
        env["PREFLIGHT_DATABASE_URL"] = db
    log_path = data_dir / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                str(VENV_BIN / "preflight"),
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                str(workers),
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server("preflight", proc, port, data_dir, log_path, {**env, "_WORKERS": str(workers)})
    try:
        _wait_ready(server)
        yield server
    finally:
        server.stop()
        if own:
            shutil.rmtree(data_dir, ignore_errors=True)


@contextlib.contextmanager
def bare_server(body_size: int, workers: int = 2) -> Iterator[Server]:
    """bench/bare_app.py under uvicorn with the settings ``preflight serve`` uses (workers, log level info)."""
    data_dir = pathlib.Path(tempfile.mkdtemp(prefix="preflight-bare-"))
    port = free_port()
    env = dict(os.environ, BARE_BODY_BYTES=str(body_size))
    log_path = data_dir / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "bench.bare_app:app",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                str(workers),
                "--log-level",
                "info",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server("bare", proc, port, data_dir, log_path, {"_WORKERS": str(workers)})
    try:
        _wait_ready(server)
        yield server
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


# -- PostgreSQL scratch database ------------------------------------------------------------------------------
@contextlib.contextmanager
def pg_database(name: str = "preflight_bench") -> Iterator[str]:
    """A fresh database (dropped first, dropped after); never the test suite's ``test``."""
    assert name != "test"
    args = ["-h", PG_HOST, "-U", PG_USER]
    subprocess.run(["dropdb", *args, "--if-exists", "--force", name], check=True, capture_output=True)
    subprocess.run(["createdb", *args, name], check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg://{PG_USER}@{PG_HOST}:5432/{name}"
    finally:
        subprocess.run(["dropdb", *args, "--if-exists", "--force", name], capture_output=True)


# -- seeding through the API ------------------------------------------------------------------------------------
def manifest_body() -> dict:
    import json

    config = json.loads((ROOT / "tests" / "fixtures" / "models" / FIXTURE / "config.json").read_text())
    return {
        "name": "meta-llama/Llama-3.1-70B",
        "version": "1",
        "uri": "s3://weights/meta-llama/Llama-3.1-70B",
        "config": config,
    }


async def seed_fleet(
    url: str, n_nodes: int, *, per_plan: int = 1, concurrency: int = 16, prefix: str = "gpu"
) -> dict[str, dict]:
    """Register ``n_nodes`` 8×H100 nodes, the Llama-3.1-70B manifest, and plans (``per_plan`` nodes per plan).
    Returns {node name: {"token": agent token, "plan_id": id}}."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    fleet: dict[str, dict] = {}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=120) as c:
        r = await c.post("/v1/manifests", json=manifest_body())
        assert r.status_code in (201, 409), r.text
        names = [f"{prefix}-{i:05d}" for i in range(n_nodes)]
        sem = asyncio.Semaphore(concurrency)

        async def node(name: str):
            async with sem:
                for attempt in range(5):
                    r = await c.post(
                        "/v1/nodes", json={"name": name, "gpu": H100, "gpu_count": 8, "interconnect": "nvlink"}
                    )
                    if r.status_code == 201:
                        fleet[name] = {"token": r.json()["agent_token"]}
                        return
                    await asyncio.sleep(0.2 * (attempt + 1))
                raise RuntimeError(f"register {name}: {r.status_code} {r.text[:300]}")

        async def plan(group: list[str]):
            async with sem:
                for attempt in range(5):
                    r = await c.post(
                        "/v1/plans", json={"manifest": MANIFEST, "nodes": group, "engine_args": ENGINE_ARGS}
                    )
                    if r.status_code == 201:
                        for n in group:
                            fleet[n]["plan_id"] = r.json()["id"]
                        return
                    await asyncio.sleep(0.2 * (attempt + 1))
                raise RuntimeError(f"plan {group[0]}..: {r.status_code} {r.text[:300]}")

        await asyncio.gather(*(node(n) for n in names))
        groups = [names[i : i + per_plan] for i in range(0, len(names), per_plan)]
        await asyncio.gather(*(plan(g) for g in groups))
    return fleet


def plan_size(url: str, name: str, token: str) -> int:
    r = httpx.get(f"{url}/v1/nodes/{name}/plan", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    r.raise_for_status()
    return len(r.content)


def machine() -> str:
    import platform

    cpu = "?"
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}"
