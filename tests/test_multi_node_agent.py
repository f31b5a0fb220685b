"""A two-node group end to end with the real agent CLI against a live service: each node runs its own command
from its own claims (the worker with --headless and its rank), reports carry the rank, a group member never boots
offline, and a member whose head holds another group plan refuses to start."""

from __future__ import annotations

import json

from sqlalchemy import create_engine, text

from tests.support import model_config
from tests.test_agent_boot import Node
from tests.test_live import admin, free_port, servers  # noqa: F401

TP16 = {"tensor_parallel_size": 16, "max_model_len": 32768}


def group(servers, tmp_path):
    (url,) = servers(1)
    c = admin(url)
    nodes = {}
    for name, addr in (("head-1", "10.1.0.1"), ("worker-1", "10.1.0.2")):
        r = c.post("/v1/nodes", json={"name": name, "gpu": "h200-141gb", "gpu_count": 8, "address": addr})
        assert r.status_code == 201, r.text
        nodes[name] = Node(tmp_path, url, r.json()["agent_token"], name=name, gpus="h200-sxm-8")
    r = c.post("/v1/manifests", json={"name": "deepseek-ai/DeepSeek-V3", "version": "1", "uri": "s3://dsv3",
                                      "config": model_config("deepseek-ai__DeepSeek-V3")})
    assert r.status_code == 201, r.text
    r = c.post("/v1/plans", json={"manifest": "deepseek-ai/DeepSeek-V3@1", "nodes": ["head-1", "worker-1"],
                                  "engine_args": TP16})
    assert r.status_code == 201, r.text
    return url, c, nodes, r.json()


def test_each_node_runs_its_role_and_reports_its_rank(servers, tmp_path):
    url, c, nodes, plan = group(servers, tmp_path)
    head, worker = nodes["head-1"], nodes["worker-1"]
    for n in (head, worker):
        done = n.run()
        assert done.returncode == 0, done.stderr
    [h], [w] = head.launches(), worker.launches()
    assert "--headless" not in h.split() and "--node-rank 0" in h and "--master-addr 10.1.0.1" in h
    assert w.split()[-1] == "--headless" and "--node-rank 1" in w and "--master-addr 10.1.0.1" in w
    assert "as the worker (rank 1 of 2, group 0, head head-1)" in worker.run().stderr
    events = c.get("/v1/audit", params={"node": "worker-1", "kind": "agent.started"}).json()["items"]
    assert events[0]["payload"]["details"]["rank"] == 1 and events[0]["payload"]["details"]["role"] == "worker"
    runs = c.get("/v1/nodes/worker-1/runs").json()["items"]
    assert runs[0]["rank"] == 1 and runs[0]["role"] == "worker" and runs[0]["group_status"] == "failed"


def test_a_group_member_never_boots_offline(servers, tmp_path):
    url, c, nodes, plan = group(servers, tmp_path)
    worker = nodes["worker-1"]
    assert worker.run().returncode == 0
    down = f"http://127.0.0.1:{free_port()}"
    offline = worker.run(url=down)
    assert offline.returncode == 75 and "never offline" in offline.stderr
    assert "OFFLINE BOOT" not in offline.stderr  # only the refusal is said, not a boot that does not happen
    assert len(worker.launches()) == 1


def test_a_member_whose_head_holds_another_group_plan_refuses(servers, tmp_path, db_url):
    url, c, nodes, plan = group(servers, tmp_path)
    engine = create_engine(db_url)
    with engine.begin() as conn:  # the head's row no longer on this group's digest (a half-updated group)
        conn.execute(text("UPDATE assignments SET group_digest = :d WHERE node_name = 'head-1'"), {"d": "f" * 64})
        # and no statement stored with the plan (signed at creation, when the head's digest was the group's): the
        # service signs one at fetch time from what the head holds now
        conn.execute(text("UPDATE assignments SET freshness = NULL"))
        conn.execute(text("UPDATE cache_epochs SET epoch = epoch + 1"))
    engine.dispose()
    refused = nodes["worker-1"].run()
    assert refused.returncode == 3 and "group_digest_mismatch" in refused.stderr
    assert nodes["worker-1"].launches() == []
    assert json.loads(nodes["worker-1"].state.read_text() if nodes["worker-1"].state.exists() else "{}").get(
        "last_seq", 0) == 0
