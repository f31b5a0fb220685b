"""Real processes: the service under uvicorn, the agent as a subprocess running a stand-in `vllm`, two service
processes writing at once (PostgreSQL), and a writer killed mid-transaction."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import subprocess
import textwrap

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.support.agent_node import weights_root
from tests.support.gpus import install_nvidia_smi
from tests.support.live import PREFLIGHT, PY, admin, setup_fleet

FAKE_VLLM = textwrap.dedent("""\
    #!{py}
    import sys
    print("INFO gpu_worker.py Available KV cache memory: 61.23 GiB", flush=True)
    print("INFO kv_cache_utils.py GPU KV cache size: 501,568 tokens, Maximum concurrency for 8,192 tokens per request: 61.23x", flush=True)
    print("INFO:     Application startup complete.", flush=True)
    print("argv:", " ".join(sys.argv[1:]), flush=True)
    sys.exit(0)
""")


def test_agent_exec_runs_exactly_the_plan_and_reports_vllm_figures(servers, tmp_path):
    (url,) = servers(1)
    c = admin(url)
    tokens = setup_fleet(c, ["gpu-01"])
    plan = c.post(
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-8B",
            "nodes": ["gpu-01"],
            "engine_args": {"tensor_parallel_size": 1, "max_model_len": 8192},
        },
    ).json()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "vllm"
    fake.write_text(FAKE_VLLM.format(py=PY))
    fake.chmod(0o755)
    install_nvidia_smi(bindir, "h100-sxm-8")  # the hardware setup_fleet registers
    env = {
        **os.environ,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "PREFLIGHT_DATA_DIR": str(tmp_path / "agent"),
        "PREFLIGHT_WEIGHTS_ROOT": str(weights_root(tmp_path / "weights")),  # the weights setup_fleet's manifest names
    }
    state = tmp_path / "state.json"
    trust = tmp_path / "trust.json"
    trust.write_text(httpx.get(f"{url}/.well-known/jwks.json").text)
    run = subprocess.run(
        [
            PREFLIGHT,
            "agent",
            "run",
            "--server",
            url,
            "--node",
            "gpu-01",
            "--token",
            tokens["gpu-01"],
            "--state",
            str(state),
            "--trust",
            str(trust),
            "--exec",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert "argv: " + " ".join(plan["argv"][1:]) + "\n" in run.stdout  # exactly the signed argv
    assert json.loads(state.read_text())["last_seq"] == 1
    history = c.get("/v1/nodes/gpu-01/history").json()["items"][0]
    assert history["plan_id"] == plan["id"] and history["running_at"] and history["fetches"] == 1
    cal = c.get("/v1/calibration").json()
    assert cal["count"] == 1 and cal["items"][0]["actual_kv_tokens"] == 501568
    assert cal["items"][0]["predicted_kv_tokens"] == plan["budget"]["kv_cache_tokens"]
    # a second boot with the same plan (a reboot) runs it again, without a new delivery
    again = subprocess.run(
        [
            PREFLIGHT,
            "agent",
            "run",
            "--server",
            url,
            "--node",
            "gpu-01",
            "--token",
            tokens["gpu-01"],
            "--state",
            str(state),
            "--trust",
            str(trust),
            "--exec",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0 and "argv: " + " ".join(plan["argv"][1:]) + "\n" in again.stdout
    history = c.get("/v1/nodes/gpu-01/history").json()["items"][0]
    assert history["fetches"] == 1 and len(c.get("/v1/nodes/gpu-01/runs").json()["items"]) == 2


def test_agent_refuses_a_plan_when_its_state_has_seen_a_newer_seq(servers, tmp_path):
    (url,) = servers(1)
    c = admin(url)
    tokens = setup_fleet(c, ["gpu-01"])
    c.post(
        "/v1/plans",
        json={"manifest": "meta-llama/Llama-3.1-8B", "nodes": ["gpu-01"], "engine_args": {"max_model_len": 8192}},
    )
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"last_seq": 7, "etag": None}))
    trust = tmp_path / "trust.json"
    trust.write_text(httpx.get(f"{url}/.well-known/jwks.json").text)
    run = subprocess.run(
        [
            PREFLIGHT,
            "agent",
            "run",
            "--server",
            url,
            "--node",
            "gpu-01",
            "--token",
            tokens["gpu-01"],
            "--state",
            str(state),
            "--trust",
            str(trust),
            "--print",
        ],
        env={**os.environ, "PREFLIGHT_DATA_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 3 and "replayed_seq" in run.stderr and "vllm serve" not in run.stdout
    assert json.loads(state.read_text()) == {"last_seq": 7, "etag": None}  # a refused plan changes nothing
    refused = c.get("/v1/audit", params={"node": "gpu-01", "kind": "agent.refused"}).json()["items"]
    assert refused and refused[0]["payload"]["details"]["reason"] == "replayed_seq"


def test_two_processes_200_plans_and_reports_keep_one_chain(db_url, servers):
    if not db_url.startswith("postgresql"):
        pytest.skip("concurrent service processes are the PostgreSQL production path")
    urls = servers(2)
    c = admin(urls[0])
    nodes = [f"gpu-{i:03d}" for i in range(20)]
    tokens = setup_fleet(c, nodes)

    def create(i):
        with admin(urls[i % 2]) as cl:
            r = cl.post(
                "/v1/plans",
                json={
                    "manifest": "meta-llama/Llama-3.1-8B",
                    "nodes": [nodes[i % 20]],
                    "engine_args": {"max_model_len": 1024 + i},
                },
            )
            return r.status_code, r.json().get("id")

    with cf.ThreadPoolExecutor(16) as pool:
        created = list(pool.map(create, range(200)))
    assert all(code == 201 for code, _ in created), created[:3]

    # reports go to each node's current plan (a report on a superseded plan is a 409): 10 per node
    current = {n: c.get(f"/v1/nodes/{n}/history").json()["items"][0]["plan_id"] for n in nodes}

    def report(i):
        n = nodes[i % 20]
        with httpx.Client(base_url=urls[i % 2], headers={"Authorization": f"Bearer {tokens[n]}"}, timeout=60) as cl:
            plan_id = current[n]
            return cl.post(f"/v1/nodes/{n}/reports", json={"plan_id": plan_id, "status": "fetched"}).status_code

    with cf.ThreadPoolExecutor(16) as pool:
        assert set(pool.map(report, range(200))) == {201}
    v = c.get("/v1/audit/verify").json()
    assert v["ok"] is True
    engine = create_engine(db_url)
    with engine.connect() as conn:
        ids = [r[0] for r in conn.execute(text("SELECT id FROM audit_events ORDER BY id"))]
        plan_ids = {r[0] for r in conn.execute(text("SELECT id FROM plans"))}
        seqs = conn.execute(
            text("SELECT node_name, array_agg(seq ORDER BY seq) FROM assignments GROUP BY node_name")
        ).all()
    engine.dispose()
    assert {pid for _, pid in created} <= plan_ids  # every acknowledged write is present
    # 20 nodes + 1 manifest + 200 plans (+ 180 supersessions: 10 plans per node) + 200 reports, each exactly once
    assert v["events"] == len(ids) == 21 + 200 + 180 + 200
    for _, node_seqs in seqs:
        assert node_seqs == list(range(1, len(node_seqs) + 1))  # per-node seq: no gaps, no duplicates


def test_same_idempotency_key_50_times_concurrently_makes_one_plan(db_url, servers):
    urls = servers(2 if db_url.startswith("postgresql") else 1)
    c = admin(urls[0])
    setup_fleet(c, ["gpu-01"])
    body = {"manifest": "meta-llama/Llama-3.1-8B", "nodes": ["gpu-01"], "engine_args": {"max_model_len": 8192}}

    def post(i):
        with admin(urls[i % len(urls)]) as cl:
            r = cl.post("/v1/plans", json=body, headers={"Idempotency-Key": "deploy-42"})
            return r.status_code, r.json()["id"]

    with cf.ThreadPoolExecutor(25) as pool:
        results = list(pool.map(post, range(50)))
    assert {code for code, _ in results} == {201}
    assert len({pid for _, pid in results}) == 1
    history = c.get("/v1/nodes/gpu-01/history").json()["items"]
    assert len(history) == 1
    other = c.post(
        "/v1/plans", json={**body, "engine_args": {"max_model_len": 4096}}, headers={"Idempotency-Key": "deploy-42"}
    )
    assert other.status_code == 422 and "different request body" in other.json()["detail"]


CRASHER = textwrap.dedent("""\
    import os, signal, sys
    from service import audit
    from service.db.session import Database
    db = Database(sys.argv[1])
    with db.transaction() as s:
        audit.append(s, actor="crasher", kind="node.registered", subject="node:half", node="half", payload={{}})
        from service.db.models import Node
        s.add(Node(name="half", gpu_id="h100-sxm-80gb", gpu={{}}, gpu_count=8, labels={{}}))
        s.flush()
        print("flushed", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
""")


def test_writer_killed_mid_transaction_leaves_no_rows_and_an_intact_chain(db_url, db, tmp_path):
    from service import audit as audit_mod

    with db.transaction() as s:
        audit_mod.append(s, actor="t", kind="node.registered", subject="node:first", payload={})
    script = tmp_path / "crash.py"
    script.write_text(CRASHER.format())
    run = subprocess.run(
        [PY, str(script), db_url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    assert run.returncode == -signal.SIGKILL and "flushed" in run.stdout
    with db.transaction() as s:
        assert s.execute(text("SELECT count(*) FROM nodes WHERE name = 'half'")).scalar() == 0
        assert s.execute(text("SELECT count(*) FROM audit_events")).scalar() == 1
        assert audit_mod.verify_chain(s)["ok"] is True
        audit_mod.append(s, actor="t", kind="node.registered", subject="node:after", payload={})
    with db.transaction() as s:
        assert audit_mod.verify_chain(s)["events"] == 2
