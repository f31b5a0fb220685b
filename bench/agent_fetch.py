"""The agent fetch ``GET /v1/nodes/{name}/plan`` over HTTP vs a bare FastAPI endpoint of the same size.

    python -m bench.agent_fetch [--nodes 200] [--conc 32 128] [--duration 10] [--db sqlite pg]

For each database, ``preflight serve --workers 2`` (uvicorn, as in production) runs on 127.0.0.1 with a throw-away
data dir (PostgreSQL: a scratch database ``preflight_bench``, dropped afterwards); ``--nodes`` 8×H100 nodes are
registered, each with its own signed plan. The load generator is ``wrk`` (one thread, ``-c N`` connections, HTTP/1.1
keep-alive) with a Lua script that cycles through the nodes, each request carrying that node's agent token, so
fetches spread over all nodes. The baseline is bench/bare_app.py — the same route returning a constant body of the
same byte size and headers — on the same uvicorn settings (2 workers, log level info, access log on).
Each cell: a 2 s warm-up, then ``--duration`` seconds measured. An agent's first fetch of its plan authenticates,
reads the assignment and records a ``plan.fetched`` audit event (group-committed, services/agent_writes.py); repeats
are answered from the process's caches (coherent across processes, services/epochs.py) by the ASGI fast path in front
of FastAPI's routing. The "route" rows send ``?wait=0``, which skips the fast path: the same caches behind FastAPI's
routing, parameter handling and dependency injection.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import pathlib
import shutil
import subprocess
import tempfile

from .common import bare_server, machine, pg_database, plan_size, preflight_server, seed_fleet, table

LUA = r"""
local nodes = {%s}
local i = 0
request = function()
  i = i + 1
  local n = nodes[(i %% #nodes) + 1]
  return wrk.format("GET", n[1], {["Authorization"] = n[2]})
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('RESULT {"requests": %%d, "duration_us": %%d, "p50_us": %%d, "p99_us": %%d, ' ..
    '"mean_us": %%f, "max_us": %%d, "connect": %%d, "read": %%d, "write": %%d, "status": %%d, "timeout": %%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency.mean,
    latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end
"""


def wrk(url: str, script: pathlib.Path, conc: int, duration: int) -> dict:
    out = subprocess.run(
        ["wrk", "-t", "1", "-c", str(conc), "-d", f"{duration}s", "--timeout", "10s", "-s", str(script), url],
        capture_output=True,
        text=True,
        timeout=duration + 60,
    )
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"wrk failed: {out.stdout}\n{out.stderr}")
    r = json.loads(line[len("RESULT ") :])
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    r["errors"] = r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"]
    return r


def write_script(path: pathlib.Path, fleet: dict[str, dict], query: str = "") -> None:
    entries = ",".join(f'{{"/v1/nodes/{n}/plan{query}","Bearer {v["token"]}"}}' for n, v in sorted(fleet.items()))
    path.write_text(LUA % entries)


def run_cells(name: str, url: str, script: pathlib.Path, concs: list[int], duration: int) -> list[dict]:
    cells = []
    for c in concs:
        wrk(url, script, c, 2)  # warm-up (connections, caches, JIT-free but pools/pages warm)
        r = wrk(url, script, c, duration)
        r.update(server=name, conc=c)
        cells.append(r)
        print(
            f"  {name:<22} c={c:<4} {r['rps']:8.0f} req/s  p50 {r['p50_us'] / 1000:6.1f} ms  "
            f"p99 {r['p99_us'] / 1000:6.1f} ms  errors {r['errors']}",
            flush=True,
        )
    return cells


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--conc", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--db", nargs="+", choices=["sqlite", "pg"], default=["pg", "sqlite"])
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install wrk")

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="preflight-fetch-"))
    script, routed = tmp / "fetch.lua", tmp / "fetch-routed.lua"
    cells, size = [], None
    try:
        for db in args.db:
            ctx = pg_database() if db == "pg" else contextlib.nullcontext("sqlite")
            with ctx as url_db, preflight_server(url_db, workers=args.workers) as srv:
                fleet = asyncio.run(seed_fleet(srv.url, args.nodes, per_plan=1, concurrency=8))
                write_script(script, fleet)
                write_script(routed, fleet, "?wait=0")  # a query string skips the fast path: FastAPI's route
                first = sorted(fleet)[0]
                size = plan_size(srv.url, first, fleet[first]["token"])
                print(f"preflight ({db}): {len(fleet)} nodes with plans, JWS body {size} bytes", flush=True)
                label = f"preflight ({'PostgreSQL' if db == 'pg' else 'SQLite'})"
                cells += run_cells(label, srv.url, script, args.conc, args.duration)
                cells += run_cells(label + " route", srv.url, routed, args.conc, args.duration)
                rss = srv.rss_mib()
                print(f"  worker RSS after: {rss[0]:.0f} MiB (supervisor {rss[1]:.0f} MiB)", flush=True)
        with bare_server(size, workers=args.workers) as bare:
            cells += run_cells("bare FastAPI constant", bare.url, script, args.conc, args.duration)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    bare_by_c = {c["conc"]: c for c in cells if c["server"].startswith("bare")}
    rows = []
    for c in cells:
        ratio = c["rps"] / bare_by_c[c["conc"]]["rps"] * 100 if c["conc"] in bare_by_c else float("nan")
        c["ratio_pct"] = ratio
        rows.append(
            [
                c["server"],
                c["conc"],
                c["requests"],
                c["rps"],
                c["p50_us"] / 1000,
                c["p99_us"] / 1000,
                c["errors"],
                f"{ratio:.0f} %",
            ]
        )
    print(
        f"\nagent fetch, {args.nodes} nodes, body {size} bytes, uvicorn --workers {args.workers}, wrk -t1, "
        f"{args.duration} s per cell — {machine()}"
    )
    print(table(["server", "clients", "requests", "req/s", "p50 ms", "p99 ms", "errors", "vs bare"], rows))
    print("target ≥ 50 % of bare (goal 60 %)")
    return cells


if __name__ == "__main__":
    main()
