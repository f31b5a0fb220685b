"""Boot storm: N simulated agents (default 10,000) each fetch their plan and post a ``fetched`` report, all at once.

    python -m bench.boot_storm [--agents 10000] [--conc 512] [--cap 240] [--db pg|sqlite] [--profile] [--no-bare]

``preflight serve --workers 2`` (uvicorn) on a scratch PostgreSQL database with a throw-away data dir.
Setup, not timed: N 8×H100 nodes registered (concurrently), plans issued 100 nodes per plan (one JWS per node).
Storm: one httpx AsyncClient (HTTP/1.1 keep-alive, at most ``--conc`` connections); every agent is a task that does
``GET /v1/nodes/{name}/plan`` (its own agent token; expects 200 application/jose) then
``POST /v1/nodes/{name}/reports {"plan_id": X-Plan-Id, "status": "fetched"}`` (expects 201). Reported: wall time
until the last agent is done, per-request p50/p99, agents served, errors (non-expected status, transport errors,
agents unfinished at ``--cap`` seconds), server RSS from /proc (sum of the uvicorn workers; peak sampled every
0.5 s, and the supervisor apart), and the load generator's own CPU time (it shares the 2 cores with the server).
The chain is then sealed and verified (``check_records``). Then, with the preflight server stopped, the same storm —
same agents, client, connections — runs against bench/bare_app.py (uvicorn, same workers; no auth, no database:
what FastAPI itself costs for the 20,000 requests), and the figures are printed side by side with the ratio of wall
times and of server CPU per agent.
``--profile``: ``py-spy record`` (raw, 200 Hz, CPU only) on every worker during the storm only (not the setup), then
the top functions by inclusive and self samples (bench/profile_server.py:top); the profiler costs the server some CPU,
so a profiled run's wall time is not a figure to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import resource
import time

from .common import bare_server, cpu_seconds, machine, pct, pg_database, preflight_server, seed_fleet, table
from .rawhttp import Conn

PG_DB = "preflight_bench_storm"  # its own scratch database: other benchmarks may run at the same time


async def storm(url: str, fleet: dict[str, dict], conc: int, cap: float, server) -> dict:
    """``conc`` keep-alive connections (bench/rawhttp.py: a full client would take the CPU the server needs) drain
    a queue of agents; each agent fetches its plan, then reports ``fetched`` with the plan id it was served."""
    host, port = url.split("//", 1)[1].split(":")
    lat_fetch, lat_report, errors = [], [], collections.Counter()
    body_bytes = [0]
    done, peak = 0, [0.0, 0.0]
    queue: asyncio.Queue = asyncio.Queue()
    for n, v in fleet.items():
        queue.put_nowait((n, v["token"]))

    async def worker():
        nonlocal done
        conn = Conn(host, int(port))
        while True:
            try:
                name, token = queue.get_nowait()
            except asyncio.QueueEmpty:
                conn.close()
                return
            h = {"Authorization": f"Bearer {token}"}
            try:
                s = time.perf_counter()
                status, hdrs, plan = await conn.request("GET", f"/v1/nodes/{name}/plan", h)
                lat_fetch.append(time.perf_counter() - s)
                if status != 200 or not hdrs.get("content-type", "").startswith("application/jose"):
                    errors[f"fetch {status}"] += 1
                    continue
                body_bytes[0] = len(plan)
                body = json.dumps({"plan_id": hdrs["x-plan-id"], "status": "fetched"}).encode()
                s = time.perf_counter()
                status, _, _ = await conn.request(
                    "POST", f"/v1/nodes/{name}/reports", {**h, "Content-Type": "application/json"}, body
                )
                lat_report.append(time.perf_counter() - s)
                if status != 201:
                    errors[f"report {status}"] += 1
                    continue
                done += 1
            except (OSError, ConnectionError, asyncio.IncompleteReadError) as exc:
                errors[type(exc).__name__] += 1
                conn.close()

    async def sample_rss():
        while True:
            w, sup = server.rss_mib()
            peak[0], peak[1] = max(peak[0], w), max(peak[1], sup)
            await asyncio.sleep(0.5)

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    srv0 = server.cpu_seconds()
    sampler = asyncio.create_task(sample_rss())
    t0 = time.perf_counter()
    tasks = [asyncio.create_task(worker()) for _ in range(conc)]
    finished, pending = await asyncio.wait(tasks, timeout=cap)
    wall = time.perf_counter() - t0
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    unfinished = len(fleet) - done - sum(errors.values())
    if unfinished > 0:
        errors[f"unfinished at {cap:.0f} s"] += unfinished
    sampler.cancel()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    w, sup = server.rss_mib()
    lat_fetch.sort()
    lat_report.sort()
    return {
        "agents": len(fleet),
        "body_bytes": body_bytes[0],
        "conc": conc,
        "wall": wall,
        "served": done,
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "fetch_p50": pct(lat_fetch, 50) * 1000,
        "fetch_p99": pct(lat_fetch, 99) * 1000,
        "report_p50": pct(lat_report, 50) * 1000,
        "report_p99": pct(lat_report, 99) * 1000,
        "rss_peak": peak[0],
        "rss_after": w,
        "rss_supervisor": max(peak[1], sup),
        "client_cpu": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
        "server_cpu": server.cpu_seconds() - srv0,
    }


def check_records(url: str) -> dict:
    """After the storm (workers still up, so their sealers have run): what the database holds — one
    ``plan.fetched`` event per agent and one ``fetched`` report per agent — and a full verification of the chain."""
    from sqlalchemy import create_engine, func, select
    from sqlalchemy.orm import Session

    from service.audit import seal, verify_chain
    from service.db.models import AuditEvent, Report

    engine = create_engine(url)
    try:
        with Session(engine) as s:
            with s.begin():
                seal(s)  # anything a worker has not sealed yet
            fetched = s.scalar(select(func.count()).select_from(AuditEvent).where(AuditEvent.kind == "plan.fetched"))
            reports = s.scalar(select(func.count()).select_from(Report).where(Report.status == "fetched"))
            v = verify_chain(s)
    finally:
        engine.dispose()
    return {
        "fetched_events": fetched,
        "report_rows": reports,
        "chain_ok": v["ok"],
        "chain_events": v["events"],
        "chain_pending": v.get("pending", 0),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=10_000)
    ap.add_argument("--conc", type=int, default=512, help="client connections (bounded pool)")
    ap.add_argument("--cap", type=float, default=240, help="give up after this many seconds (counted as errors)")
    ap.add_argument("--db", choices=["pg", "sqlite"], default="pg")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--profile",
        nargs="?",
        const="cpu",
        choices=["cpu", "gil"],
        help="py-spy every worker during the storm (see the docstring); gil: only the thread holding the GIL",
    )
    ap.add_argument("--no-bare", action="store_true", help="skip the bare FastAPI cell")
    args = ap.parse_args(argv)
    ctx = pg_database(PG_DB) if args.db == "pg" else contextlib.nullcontext("sqlite")
    with ctx as db:
        with preflight_server(db, workers=args.workers) as srv:
            t = time.perf_counter()
            fleet = asyncio.run(seed_fleet(srv.url, args.agents, per_plan=100, concurrency=8))
            setup = time.perf_counter() - t
            w0, _ = srv.rss_mib()
            print(
                f"setup (not counted): {len(fleet)} nodes + plans in {setup:.0f} s; worker RSS before storm "
                f"{w0:.0f} MiB",
                flush=True,
            )
            pg0 = _db_cpu(db)
            with _profiled(srv.workers(), args.profile == "gil") if args.profile else contextlib.nullcontext() as prof:
                r = asyncio.run(storm(srv.url, fleet, args.conc, args.cap, srv))
            r["db_cpu"] = _db_cpu(db, pg0)
            r.update(check_records(db if db != "sqlite" else f"sqlite:///{srv.data_dir / 'preflight.db'}"))
        r.update(setup=setup, rss_before=w0)
        print(f"preflight: {r['wall']:.1f} s, {r['errors']} errors", flush=True)
        if not args.no_bare:  # the preflight server is stopped: the bare one has the cores to itself, like it had
            with bare_server(r["body_bytes"], workers=args.workers) as bare:
                w0, _ = bare.rss_mib()
                b = asyncio.run(storm(bare.url, fleet, args.conc, args.cap, bare))
            b.update(rss_before=w0)
            r["bare"] = b
    _print(args, r)
    if args.profile:
        from .profile_server import top

        incl, self_, total = top(prof)
        print(f"py-spy samples over the workers during the storm: {total}")
        print(table(["inclusive: function", "%"], [[k, 100 * v / max(1, total)] for k, v in incl]))
        print(table(["self: function", "%"], [[k, 100 * v / max(1, total)] for k, v in self_]))
    return r


def _print(args, r: dict) -> None:
    b = r.get("bare")
    cells = [r, b] if b else [r]

    def row(label: str, f) -> list:
        return [label, *(f(c) for c in cells)]

    def cpu(c: dict) -> str:
        return f"{c['server_cpu']:.1f}, {c['server_cpu'] / max(1, c['served']) * 1000:.2f}"

    print(
        f"\nboot storm: {args.agents:,} agents × (fetch + report), {args.conc} client connections, "
        f"{'PostgreSQL' if args.db == 'pg' else 'SQLite'}, uvicorn --workers {args.workers} — {machine()}"
    )
    print(
        table(
            ["metric", "preflight", *(["bare FastAPI"] if b else [])],
            [
                row("time until all served (s)", lambda c: c["wall"]),
                row("agents served", lambda c: c["served"]),
                row("errors", lambda c: c["errors"]),
                row("requests/s (fetch+report)", lambda c: 2 * c["served"] / c["wall"]),
                row("fetch p50 / p99 (ms)", lambda c: f"{c['fetch_p50']:.0f} / {c['fetch_p99']:.0f}"),
                row("report p50 / p99 (ms)", lambda c: f"{c['report_p50']:.0f} / {c['report_p99']:.0f}"),
                row(
                    "workers RSS before / peak / after (MiB)",
                    lambda c: f"{c['rss_before']:.0f} / {c['rss_peak']:.0f} / {c['rss_after']:.0f}",
                ),
                row("supervisor RSS (MiB)", lambda c: f"{c['rss_supervisor']:.0f}"),
                row("load generator CPU (s)", lambda c: c["client_cpu"]),
                row("server CPU (s), per agent (ms)", cpu),
                row(
                    "database CPU (s), per agent (ms)",
                    lambda c: (
                        "—"
                        if c.get("db_cpu") is None
                        else f"{c['db_cpu']:.1f}, {c['db_cpu'] / max(1, c['served']) * 1000:.2f}"
                    ),
                ),
            ],
        )
    )
    print(
        f"recorded: {r['fetched_events']:,} plan.fetched events, {r['report_rows']:,} reports; audit chain "
        f"{'verified' if r['chain_ok'] else 'BROKEN'} ({r['chain_events']:,} events, {r['chain_pending']} pending)"
    )
    for c in cells:
        if c["error_kinds"]:
            print("errors by kind:", "preflight" if c is r else "bare", c["error_kinds"])
    ok = not r["errors"] and r["chain_ok"]
    if b:
        ratio = r["wall"] / b["wall"]
        cpu_ratio = (r["server_cpu"] / max(1, r["served"])) / (b["server_cpu"] / max(1, b["served"]))
        print(
            f"storm / bare: {r['wall']:.1f} s / {b['wall']:.1f} s = {ratio:.2f}× wall; server CPU per agent "
            f"{cpu_ratio:.2f}×; goal ≤ 3× with 0 errors and the chain verified: "
            f"{'met' if ratio <= 3 and ok and not b['errors'] else 'MISSED'}"
        )
    else:
        print(f"0 errors and the chain verified: {'yes' if ok else 'NO'}")


def _db_cpu(db: str, before: dict[int, float] | None = None):
    """PostgreSQL: the CPU seconds of the backends serving the scratch database — per backend now (``before`` None),
    else the total used since ``before`` (a backend started since counts from zero). SQLite: None (in the workers)."""
    if db == "sqlite":
        return None
    from sqlalchemy import create_engine, text

    engine = create_engine(db)
    try:
        with engine.connect() as c:
            pids = list(
                c.scalars(
                    text(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                )
            )
    finally:
        engine.dispose()
    now = cpu_seconds(pids)
    if before is None:
        return now
    return sum(v - before.get(pid, 0.0) for pid, v in now.items())


@contextlib.contextmanager
def _profiled(pids: list[int], gil: bool = False):
    """py-spy on each pid until the block ends (SIGINT makes it write its file); yields the list of raw files, filled
    once the block has ended."""
    import pathlib
    import signal
    import subprocess
    import tempfile

    from .common import VENV_BIN

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="preflight-storm-prof-"))
    spies = []
    for pid in pids:
        out = tmp / f"w{pid}.raw"
        spies.append(
            subprocess.Popen(
                [
                    str(VENV_BIN / "py-spy"),
                    "record",
                    "--pid",
                    str(pid),
                    "--format",
                    "raw",
                    "--rate",
                    "200",
                    "--nonblocking",
                    *(["--gil"] if gil else []),
                    "-o",
                    str(out),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    time.sleep(1.0)  # py-spy attached before the first request
    files: list[pathlib.Path] = []
    try:
        yield files
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            try:
                spy.wait(timeout=60)
            except subprocess.TimeoutExpired:
                spy.kill()
        files.extend(o for o in (tmp / f"w{pid}.raw" for pid in pids) if o.exists())


if __name__ == "__main__":
    main()
