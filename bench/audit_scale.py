"""Audit at scale on PostgreSQL: 1,000,000 audit events, then

- sealing throughput (events chained per second by one sealer),
- a full ``verify`` of the chain,
- ``GET /v1/audit`` filtered by node, by plan, by model + time window (p50/p99 over random keys),
- ``GET /v1/nodes/{name}/history`` with 5,000 nodes × 10 plans each (p50/p99),
- append throughput with 2 writer processes (each its own sealer thread, as two service replicas), and the time
  until every appended event is sealed.

    python -m bench.audit_scale [--events 1000000] [--nodes 5000] [--queries 200] [--appends 3000]

Rows are bulk-loaded with COPY (the load is setup, not measured), with one ``plan.created`` event per plan besides. Scratch database ``preflight_audit_bench``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import random
import statistics
import tempfile
import time
import uuid

import psycopg

from service import audit
from service.db.migrate import upgrade
from service.db.session import Database

from .common import machine, pct, pg_database, table

TOKEN = "audit-bench-admin-token-0123456789"


def load(url: str, n_events: int, n_nodes: int) -> dict:
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    t0 = time.perf_counter()
    plans: list[tuple[str, str]] = []
    base = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    with psycopg.connect(dsn) as conn:
        with conn.cursor() as cur:
            cur.execute(
                "INSERT INTO manifests (name, version, uri, config, checkpoint, digests, digest, created_at) "
                "VALUES ('m', '1', 's3://m', '{}', '{}', '{}', 'sha256:0', now()) RETURNING id"
            )
            mid = cur.fetchone()[0]
            with cur.copy("COPY nodes (name, gpu_id, gpu, gpu_count, labels, created_at, updated_at) FROM STDIN") as cp:
                for i in range(n_nodes):
                    cp.write_row((f"gpu-{i:05d}", "h100-sxm-80gb", "{}", 8, "{}", base, base))
            with cur.copy(
                "COPY plans (id, manifest_id, request, verdict, findings, argv, command, env, vllm_version, "
                "status, created_by, created_at) FROM STDIN"
            ) as cp:
                for i in range(n_nodes):
                    for k in range(10):
                        pid = str(uuid.UUID(int=random.getrandbits(128)))
                        plans.append((pid, f"gpu-{i:05d}"))
                        cp.write_row(
                            (
                                pid,
                                mid,
                                "{}",
                                "accept",
                                "[]",
                                '["vllm","serve","m"]',
                                "vllm serve m",
                                "{}",
                                "0.33.0",
                                "superseded" if k < 9 else "active",
                                "bench",
                                base,
                            )
                        )
            with cur.copy(
                "COPY assignments (plan_id, node_name, seq, signed, etag, status, fetch_count, "
                "first_fetched_at, last_fetched_at, created_at) FROM STDIN"
            ) as cp:
                for j, (pid, node) in enumerate(plans):
                    k = j % 10
                    ts = base + dt.timedelta(hours=k)
                    cp.write_row(
                        (pid, node, k + 1, "x.y.z", f'"{j}"', "active" if k == 9 else "superseded", 1, ts, ts, ts)
                    )
            with cur.copy("COPY reports (plan_id, node_name, status, details, created_at) FROM STDIN") as cp:
                for j, (pid, node) in enumerate(plans):
                    ts = base + dt.timedelta(hours=j % 10, minutes=1)
                    cp.write_row((pid, node, "started", "{}", ts))
                    cp.write_row((pid, node, "running", "{}", ts + dt.timedelta(minutes=2)))
            kinds = ["plan.created", "plan.fetched", "agent.started", "agent.running"]
            with cur.copy(
                "COPY audit_events (ts, actor, kind, subject, node, plan_id, model, payload, payload_digest) FROM STDIN"
            ) as cp:
                for j, (pid, node) in enumerate(plans):  # each plan's own event (verify checks state against it)
                    payload = {"nodes": [node], "seqs": [j % 10 + 1]}
                    cp.write_row(
                        (
                            base - dt.timedelta(seconds=len(plans) - j),
                            "bench",
                            "plan.created",
                            f"plan:{pid}",
                            node,
                            pid,
                            f"model-{j % 200}",
                            json.dumps(payload),
                            audit.sha256_hex(audit.canonical(payload)),
                        )
                    )
                for e in range(n_events):
                    pid, node = plans[e % len(plans)]
                    payload = {"seq": e % 10 + 1, "n": e}
                    cp.write_row(
                        (
                            base + dt.timedelta(seconds=e),
                            "bench",
                            kinds[e % 4],
                            f"plan:{pid}",
                            node,
                            pid,
                            f"model-{e % 200}",
                            json.dumps(payload),
                            audit.sha256_hex(audit.canonical(payload)),
                        )
                    )
        conn.commit()
        conn.execute("ANALYZE")
    return {"load_s": time.perf_counter() - t0, "plans": plans, "base": base, "events": n_events + len(plans)}


def _writer(url: str, n: int, q) -> None:
    db = Database(url)
    db.sealer.start()
    t0 = time.perf_counter()
    for i in range(n):
        with db.transaction() as s:
            audit.append(
                s, actor="writer", kind="node.updated", subject=f"node:w{i}", node="gpu-00001", payload={"i": i}
            )
    q.put(time.perf_counter() - t0)
    db.sealer.stop()


def timed(fn, keys) -> list[float]:
    out = []
    for k in keys:
        t = time.perf_counter()
        fn(k)
        out.append((time.perf_counter() - t) * 1000)
    return sorted(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--appends", type=int, default=3000, help="appends per writer process")
    args = ap.parse_args(argv)
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.settings import Settings
    from service.signing import KeyStore

    with pg_database("preflight_audit_bench") as url:
        upgrade(url)
        setup = load(url, args.events, args.nodes)
        db = Database(url)
        t = time.perf_counter()
        sealed = db.sealer.seal_now()
        seal_s = time.perf_counter() - t
        t = time.perf_counter()
        with db.transaction() as s:
            v = audit.verify_chain(s)
        verify_s = time.perf_counter() - t
        assert v["ok"] and v["events"] == setup["events"], v

        tmp = tempfile.mkdtemp()
        app = create_app(
            Settings(data_dir=tmp, database_url=url, admin_token=TOKEN),
            db=db,
            keys=KeyStore(__import__("pathlib").Path(tmp) / "keys"),
        )
        rnd = random.Random(7)
        nodes = [f"gpu-{rnd.randrange(args.nodes):05d}" for _ in range(args.queries)]
        plan_ids = [rnd.choice(setup["plans"])[0] for _ in range(args.queries)]
        windows = [
            (f"model-{rnd.randrange(200)}", setup["base"] + dt.timedelta(seconds=rnd.randrange(args.events)))
            for _ in range(args.queries)
        ]
        with TestClient(app) as c:
            c.headers["Authorization"] = f"Bearer {TOKEN}"

            def get(path, **params):
                r = c.get(path, params=params)
                assert r.status_code == 200, r.text

            res = {
                "GET /v1/audit?node=": timed(lambda n: get("/v1/audit", node=n, limit=100), nodes),
                "GET /v1/audit?plan=": timed(lambda p: get("/v1/audit", plan=p, limit=100), plan_ids),
                "GET /v1/audit?model=&since=&until=": timed(
                    lambda w: get(
                        "/v1/audit",
                        model=w[0],
                        since=w[1].isoformat(),
                        until=(w[1] + dt.timedelta(days=1)).isoformat(),
                        limit=100,
                    ),
                    windows,
                ),
                "GET /v1/nodes/{name}/history": timed(lambda n: get(f"/v1/nodes/{n}/history"), nodes),
            }
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=_writer, args=(url, args.appends, q)) for _ in range(2)]
        t = time.perf_counter()
        for p in procs:
            p.start()
        durations = [q.get() for _ in procs]
        for p in procs:
            p.join()
        append_s = max(durations)
        db.sealer.seal_now()
        all_sealed_s = time.perf_counter() - t
        with db.transaction() as s:
            v2 = audit.verify_chain(s)
        assert v2["ok"] and v2["events"] == setup["events"] + 2 * args.appends and v2["pending"] == 0, v2
        db.engine.dispose()

    print(f"\naudit at scale, PostgreSQL, {args.events:,} events, {args.nodes:,} nodes × 10 plans — {machine()}")
    rows = [[name, f"{statistics.median(v):.1f}", f"{pct(v, 99):.1f}"] for name, v in res.items()]
    print(table(["query (in-process HTTP, limit 100)", "p50 ms", "p99 ms"], rows))
    print(
        table(
            ["metric", "value"],
            [
                ["bulk load (setup, COPY)", f"{setup['load_s']:.0f} s"],
                ["seal 1M events (one sealer)", f"{seal_s:.1f} s ({sealed / seal_s:,.0f} events/s)"],
                ["full verify", f"{verify_s:.1f} s ({setup['events'] / verify_s:,.0f} events/s)"],
                [
                    "append, 2 writer processes",
                    f"{2 * args.appends:,} appends in {append_s:.1f} s "
                    f"({2 * args.appends / append_s:,.0f}/s, one transaction each)",
                ],
                ["until all sealed", f"{all_sealed_s:.1f} s; chain verified, 0 pending"],
            ],
        )
    )


if __name__ == "__main__":
    main()
