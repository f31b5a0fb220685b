"""``POST /v1/plans`` throughput on PostgreSQL: sequential, and with concurrency 8.

    python -m bench.plans_throughput [--nodes 64] [--seq 200] [--conc 8] [--n-conc 400] [--per-plan 1]

``preflight serve --workers 2`` on a scratch PostgreSQL database (``preflight_bench``, dropped afterwards) with a
throw-away data dir. Setup (not timed): the Llama-3.1-70B manifest and ``--nodes`` 8×H100 nodes. Each request asks
for TP 8 / max_model_len 8192 on one node (``--per-plan`` nodes), cycling over the nodes, so every plan after the
first round supersedes the node's previous one (the full path: resolve manifest and nodes, validate, sign one JWS per
node, supersede, audit appends). Client: httpx (sync for the sequential run, asyncio for the concurrent one).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx

from .common import ADMIN_TOKEN, ENGINE_ARGS, MANIFEST, machine, pct, pg_database, preflight_server, seed_fleet, table

HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def body(names: list[str], i: int, per_plan: int) -> dict:
    start = (i * per_plan) % len(names)
    return {
        "manifest": MANIFEST,
        "nodes": [names[(start + k) % len(names)] for k in range(per_plan)],
        "engine_args": ENGINE_ARGS,
    }


def sequential(url: str, names: list[str], n: int, per_plan: int) -> dict:
    lat, errors = [], 0
    with httpx.Client(base_url=url, headers=HEADERS, timeout=60) as c:
        for i in range(10):  # warm-up
            c.post("/v1/plans", json=body(names, i, per_plan))
        t0 = time.perf_counter()
        for i in range(n):
            s = time.perf_counter()
            r = c.post("/v1/plans", json=body(names, i, per_plan))
            lat.append(time.perf_counter() - s)
            errors += r.status_code != 201
        wall = time.perf_counter() - t0
    return _summary("sequential", 1, n, wall, lat, errors)


async def concurrent(url: str, names: list[str], n: int, conc: int, per_plan: int) -> dict:
    lat, errors = [], 0
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=60, limits=limits) as c:
        queue = iter(range(n))

        async def worker():
            nonlocal errors
            for i in queue:
                s = time.perf_counter()
                try:
                    r = await c.post("/v1/plans", json=body(names, i, per_plan))
                    errors += r.status_code != 201
                except httpx.HTTPError:
                    errors += 1
                lat.append(time.perf_counter() - s)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        wall = time.perf_counter() - t0
    return _summary("concurrent", conc, n, wall, lat, errors)


def _summary(mode, conc, n, wall, lat, errors) -> dict:
    lat.sort()
    return {
        "mode": mode,
        "conc": conc,
        "n": n,
        "wall": wall,
        "rps": n / wall,
        "p50_ms": pct(lat, 50) * 1000,
        "p99_ms": pct(lat, 99) * 1000,
        "errors": errors,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--seq", type=int, default=200, help="requests in the sequential run")
    ap.add_argument("--conc", type=int, default=8)
    ap.add_argument("--n-conc", type=int, default=400, help="requests in the concurrent run")
    ap.add_argument("--per-plan", type=int, default=1, help="nodes per plan")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    with pg_database() as db, preflight_server(db, workers=args.workers) as srv:
        fleet = asyncio.run(seed_fleet(srv.url, args.nodes, per_plan=args.nodes, concurrency=8))
        names = sorted(fleet)
        out = [
            sequential(srv.url, names, args.seq, args.per_plan),
            asyncio.run(concurrent(srv.url, names, args.n_conc, args.conc, args.per_plan)),
        ]
    print(
        f"\nPOST /v1/plans on PostgreSQL, {args.per_plan} node(s) per plan, {args.nodes} nodes cycled, "
        f"uvicorn --workers {args.workers} — {machine()}"
    )
    print(
        table(
            ["mode", "concurrency", "requests", "wall s", "plans/s", "p50 ms", "p99 ms", "errors"],
            [[r["mode"], r["conc"], r["n"], r["wall"], r["rps"], r["p50_ms"], r["p99_ms"], r["errors"]] for r in out],
        )
    )
    return out


if __name__ == "__main__":
    main()
