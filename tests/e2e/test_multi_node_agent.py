"""A two-node group end to end with the real agent CLI against a live service: each node runs its own command
from its own claims (the worker with --headless and its rank), reports carry the rank, a group member never boots
offline, a member whose head holds another group plan refuses to start, and a worker holds until its head runs the
same plan (domain/group_gate.py): after a plan change, and for good when the head refuses it."""

from __future__ import annotations

import json
import signal
import subprocess
import time

from sqlalchemy import create_engine, text

from tests.support import model_config
from tests.support.agent_node import Node
from tests.support.live import admin, free_port

TP16 = {"tensor_parallel_size": 16, "max_model_len": 32768}


def group(servers, tmp_path):
    (url,) = servers(1)
    c = admin(url)
    nodes = {}
    for name, addr in (("head-1", "10.1.0.1"), ("worker-1", "10.1.0.2")):
        r = c.post("/v1/nodes", json={"name": name, "gpu": "h200-141gb", "gpu_count": 8, "address": addr})
        assert r.status_code == 201, r.text
        nodes[name] = Node(tmp_path, url, r.json()["agent_token"], name=name, gpus="h200-sxm-8")
    r = c.post(
        "/v1/manifests",
        json={
            "name": "deepseek-ai/DeepSeek-V3",
            "version": "1",
            "uri": "s3://dsv3",
            "config": model_config("deepseek-ai__DeepSeek-V3"),
        },
    )
    assert r.status_code == 201, r.text
    r = c.post(
        "/v1/plans",
        json={"manifest": "deepseek-ai/DeepSeek-V3@1", "nodes": ["head-1", "worker-1"], "engine_args": TP16},
    )
    assert r.status_code == 201, r.text
    return url, c, nodes, r.json()


def events(c, node, kind, plan_id=None):
    items = c.get("/v1/audit", params={"node": node, "kind": kind, "limit": 1000}).json()["items"]
    return [e for e in items if plan_id is None or e["plan_id"] == plan_id]


def serve_head(c, head, plan_id):
    """The head's agent running its plan (a stand-in vLLM that keeps serving), once it reported it running. The
    heartbeat is long: the head learns of a newer plan only when it is restarted (the window the gate closes)."""
    proc = subprocess.Popen(
        head.args(None),
        env=head.env(FAKE_VLLM_MODE="serve", PREFLIGHT_HEARTBEAT_SECONDS="3600"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    for _ in range(600):  # until its report arrived (or it ended): no timing is asserted
        if events(c, "head-1", "agent.running", plan_id) or proc.poll() is not None:
            break
        time.sleep(0.1)
    assert proc.poll() is None, proc.stderr.read()
    return proc


def stop(proc):
    proc.send_signal(signal.SIGTERM)  # the agent forwards it to vLLM and reports stopped
    assert proc.wait(60) == 0


def test_each_node_runs_its_role_and_reports_its_rank(servers, tmp_path):
    url, c, nodes, plan = group(servers, tmp_path)
    head, worker = nodes["head-1"], nodes["worker-1"]
    running = serve_head(c, head, plan["id"])
    done = worker.run()
    assert done.returncode == 0, done.stderr
    stop(running)
    [h], [w] = head.launches(), worker.launches()
    assert "--headless" not in h.split() and "--node-rank 0" in h and "--master-addr 10.1.0.1" in h
    assert w.split()[-1] == "--headless" and "--node-rank 1" in w and "--master-addr 10.1.0.1" in w
    again = worker.run("--group-wait", "1")  # the head stopped: the worker holds, a bounded wait, no start
    assert again.returncode == 75 and len(worker.launches()) == 1 and "reported plan" in again.stderr
    assert "stopped: this worker waits until the head starts it again" in again.stderr
    assert "as the worker (rank 1 of 2, group 0, head head-1)" in done.stderr
    events = c.get("/v1/audit", params={"node": "worker-1", "kind": "agent.started"}).json()["items"]
    assert events[0]["payload"]["details"]["rank"] == 1 and events[0]["payload"]["details"]["role"] == "worker"
    runs = c.get("/v1/nodes/worker-1/runs").json()["items"]
    assert runs[0]["rank"] == 1 and runs[0]["role"] == "worker" and runs[0]["group_status"] == "failed"


def test_a_group_member_never_boots_offline(servers, tmp_path):
    url, c, nodes, plan = group(servers, tmp_path)
    worker = nodes["worker-1"]
    assert (
        c.post(
            "/v1/nodes/head-1/reports",
            headers={"Authorization": f"Bearer {nodes['head-1'].token}"},
            json={"plan_id": plan["id"], "status": "started"},
        ).status_code
        == 201
    )  # the head runs it
    first = worker.run()
    assert first.returncode == 0, first.stderr
    down = f"http://127.0.0.1:{free_port()}"
    offline = worker.run(url=down)
    assert offline.returncode == 75 and "never offline" in offline.stderr
    assert "OFFLINE BOOT" not in offline.stderr  # only the refusal is said, not a boot that does not happen
    assert len(worker.launches()) == 1
    # with --wait it waits for the service instead (it would refuse the offline boot)
    waiting = subprocess.Popen(
        worker.args(down, "--wait", "--poll-seconds", "0.2"),
        env=worker.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = waiting.stderr.readline()
    waiting.terminate()
    waiting.wait(30)
    assert (
        "the service is unreachable and the saved plan is a multi-node group member's, which never boots "
        "offline; waiting" in line
    ), line
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
    assert (
        json.loads(nodes["worker-1"].state.read_text() if nodes["worker-1"].state.exists() else "{}").get("last_seq", 0)
        == 0
    )


def test_a_worker_holds_until_its_head_runs_the_new_plan_then_starts(servers, tmp_path):
    """The defect: after a plan change the worker fetched and started the new plan while the head still ran the old
    one (it learns at its next heartbeat, up to 60 s later). Now the worker holds until the head reports the new plan
    started, printing why, and then starts it."""
    url, c, nodes, p1 = group(servers, tmp_path)
    head, worker = nodes["head-1"], nodes["worker-1"]
    early = worker.run("--group-wait", "2")  # before the head runs anything: a bounded wait, nothing starts
    assert early.returncode == 75 and worker.launches() == [], early.stderr
    assert f"HOLD {p1['id']}: the head head-1 has not started plan {p1['id']} (group 0) yet" in early.stderr
    assert "gave up after" in early.stderr

    running = serve_head(c, head, p1["id"])
    first = worker.run()
    assert first.returncode == 0, first.stderr
    assert "HOLD" not in first.stderr and "--max-model-len 32768" in worker.launches()[0]

    # the plan changes; the head still runs the old one (its heartbeat is an hour away)
    r = c.post(
        "/v1/plans",
        json={
            "manifest": "deepseek-ai/DeepSeek-V3@1",
            "nodes": ["head-1", "worker-1"],
            "engine_args": {**TP16, "max_model_len": 16384},
        },
    )
    assert r.status_code == 201, r.text
    p2 = r.json()
    waiting = subprocess.Popen(
        worker.args(None, "--group-wait", "300"),
        env=worker.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    said = []
    for line in waiting.stderr:  # until the worker says it holds (it has fetched, and was answered hold)
        said.append(line)
        if "HOLD" in line:
            break
    assert f"HOLD {p2['id']}: the head head-1 has not started plan {p2['id']}" in "".join(said), said
    assert len(worker.launches()) == 1  # nothing new started while the head runs the old plan

    stop(running)  # the head restarts (as at its next heartbeat): it fetches, checks and starts the new plan
    running = serve_head(c, head, p2["id"])
    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, "".join(said) + err
    stop(running)
    assert len(worker.launches()) == 2 and "--max-model-len 16384" in worker.launches()[1]
    assert "--max-model-len 16384" in head.launches()[1]
    # the record: the head started the new plan before the worker took delivery of it
    [head_started] = events(c, "head-1", "agent.started", p2["id"])
    [worker_fetched] = events(c, "worker-1", "plan.fetched", p2["id"])
    assert head_started["id"] < worker_fetched["id"]


def test_a_worker_never_starts_when_its_head_refuses_the_plan(servers, tmp_path):
    url, c, nodes, plan = group(servers, tmp_path)
    worker = nodes["worker-1"]
    # the head's nvidia-smi shows other GPUs than the node was registered with: its checks refuse the plan
    head = Node(tmp_path / "other", url, nodes["head-1"].token, name="head-1", gpus="h100-sxm-8")
    refused = head.run()
    assert refused.returncode == 3 and "REFUSED" in refused.stderr and head.launches() == []
    done = worker.run()
    assert done.returncode == 3 and worker.launches() == [], done.stderr
    assert (
        f"REFUSED group {plan['id']}: the head head-1 reported plan {plan['id']} (group 0) refused: this "
        f"worker does not start it" in done.stderr
    )
    [event] = events(c, "worker-1", "agent.refused", plan["id"])
    assert event["payload"]["details"]["reason"] == "head_refused" and event["payload"]["details"]["check"] == "group"
    assert c.get(f"/v1/plans/{plan['id']}").json()["groups"][0]["status"] == "failed"
    assert events(c, "worker-1", "plan.fetched") == []  # the plan was never delivered to the worker
