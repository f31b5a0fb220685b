"""The node agent end to end: the real CLI (`preflight agent run`) against a live uvicorn on 127.0.0.1, with a
stand-in `vllm` on the agent's PATH. Boot semantics, freshness, the pinned trust root and its rotation chain, the
env policy, offline boot, the lifecycle record, and a corrupt state file."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import pathlib
import signal
import subprocess
import time

import httpx
import pytest
from sqlalchemy import create_engine, text

from service import audit as audit_mod
from service.agent.trust import Trust
from service.agent.verify import VerificationError
from service.signing import KeyStore
from tests.support import ADMIN
from tests.support.agent_node import FAKE_VLLM, Node
from tests.support.live import PREFLIGHT, PY, Behind, admin, free_port, setup_fleet, start_server

PLAN = {
    "manifest": "meta-llama/Llama-3.1-8B",
    "nodes": ["gpu-01"],
    "engine_args": {"tensor_parallel_size": 1, "max_model_len": 8192},
}


@pytest.fixture
def fleet(servers, tmp_path):
    (url,) = servers(1)
    c = admin(url)
    tokens = setup_fleet(c, ["gpu-01"])
    return url, c, Node(tmp_path, url, tokens["gpu-01"])


def kinds(c, node="gpu-01", since_id=0):
    items = c.get("/v1/audit", params={"node": node, "after": since_id, "limit": 1000}).json()["items"]
    return [e["kind"] for e in items if e["kind"].startswith("agent.")], items


def test_reboot_relaunches_the_same_plan_and_runs_answers_which_plan_ran(fleet):
    url, c, node = fleet
    plan = c.post("/v1/plans", json=PLAN).json()
    first = node.run()
    assert first.returncode == 0, first.stderr
    second = node.run()  # a reboot: the same plan runs again
    assert second.returncode == 0, second.stderr
    expected = " ".join(plan["argv"][2:])
    assert node.launches() == ["serve " + expected] * 2
    assert json.loads(node.state.read_text())["last_seq"] == 1
    agent, events = kinds(c)
    assert agent == [
        "agent.fetched",
        "agent.started",
        "agent.running",
        "agent.exited",
        "agent.started",
        "agent.running",
        "agent.exited",
    ]
    running = next(e for e in events if e["kind"] == "agent.running")["payload"]["details"]["vllm"]
    assert running["kv_cache_tokens"] == 501568 and running["max_concurrency"] == 61.23
    assert running["kv_cache_memory_bytes_suggested"] == 65745289000
    runs = c.get("/v1/nodes/gpu-01/runs").json()["items"]
    assert [(r["plan_id"], r["seq"], r["end"], r["exit_status"]) for r in runs] == [(plan["id"], 1, "exited", 0)] * 2
    assert runs[0]["run_id"] != runs[1]["run_id"] and runs[0]["ended_at"] <= runs[1]["started_at"]


def test_crash_then_restart_runs_the_plan_again(fleet):
    url, c, node = fleet
    c.post("/v1/plans", json=PLAN)
    crashed = node.run(FAKE_VLLM_MODE="crash-once")
    assert crashed.returncode == 1, crashed.stderr  # systemd (Restart=always) starts the agent again
    restarted = node.run(FAKE_VLLM_MODE="crash-once")
    assert restarted.returncode == 0, restarted.stderr
    assert len(node.launches()) == 2
    runs = c.get("/v1/nodes/gpu-01/runs").json()["items"]
    assert [(r["end"], r["exit_status"]) for r in runs] == [("exited", 1), ("exited", 0)]
    assert "illegal memory access" in runs[0]["tail"][-1] and runs[0]["running_at"] is None
    assert runs[1]["running_at"] is not None


def rewrite_assignment(db_url, data_dir, node, **claim_changes):
    """Re-sign the node's current assignment with the service's own key and changed claims (a plan issued long ago,
    or one whose env the service would refuse today), as if stored that way."""
    engine = create_engine(db_url)
    with engine.begin() as conn:
        row = conn.execute(
            text("SELECT id, signed FROM assignments WHERE node_name = :n AND status = 'active'"), {"n": node}
        ).one()
        part = row.signed.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
        claims.update(claim_changes)
        signed = KeyStore(data_dir / "keys", create=False).sign(claims)
        conn.execute(
            text("UPDATE assignments SET signed = :s, etag = :e WHERE id = :i"),
            {"s": signed, "e": '"' + audit_mod.sha256_hex(signed.encode())[:32] + '"', "i": row.id},
        )
        conn.execute(text("UPDATE cache_epochs SET epoch = epoch + 1"))
    engine.dispose()
    return signed


def _served(url, node, signed, timeout=15.0):
    """Wait until the service answers with ``signed`` (its caches drop what they hold at the next epoch poll)."""
    deadline = time.monotonic() + timeout
    while httpx.get(f"{url}/v1/nodes/{node}/plan", headers={"Authorization": f"Bearer {ADMIN}"}).text != signed:
        assert time.monotonic() < deadline, "the service still serves the assignment it cached"
        time.sleep(0.05)


def test_a_plan_issued_40_days_ago_still_boots(fleet, db_url, tmp_path):
    url, c, node = fleet
    c.post("/v1/plans", json=PLAN)
    long_ago = int(time.time()) - 40 * 86400
    _served(url, "gpu-01", rewrite_assignment(db_url, tmp_path / "var", "gpu-01", iat=long_ago, nbf=long_ago - 60))
    r = httpx.get(f"{url}/v1/nodes/gpu-01/plan", headers={"Authorization": f"Bearer {ADMIN}"})
    assert json.loads(base64.urlsafe_b64decode(r.text.split(".")[1] + "=="))["iat"] == long_ago
    run = node.run()
    assert run.returncode == 0, run.stderr
    assert len(node.launches()) == 1


def test_a_second_preflight_with_its_own_keys_is_refused_and_the_state_is_untouched(fleet, tmp_path):
    url, c, node = fleet
    plan = c.post("/v1/plans", json=PLAN).json()
    assert node.run().returncode == 0
    state_before, trust_before = node.state.read_bytes(), node.trust.read_bytes()
    # the attacker's Preflight: same node name, a token of the same shape, its own keys, a newer seq
    spoof_db = f"sqlite:///{tmp_path / 'spoof.db'}"
    from service.db.migrate import upgrade

    upgrade(spoof_db)
    port = free_port()
    spoof = start_server(spoof_db, tmp_path / "spoof-var", port)
    try:
        s = admin(f"http://127.0.0.1:{port}")
        spoof_token = setup_fleet(s, ["gpu-01"])["gpu-01"]
        KeyStore(tmp_path / "spoof-var" / "keys").rotate()  # a key set version 2, signed by the spoof's own key
        for _ in range(3):
            assert s.post("/v1/plans", json={**PLAN, "engine_args": {"max_model_len": 4096}}).status_code == 201
        run = subprocess.run(
            [
                PREFLIGHT,
                "agent",
                "run",
                "--server",
                f"http://127.0.0.1:{port}",
                "--node",
                "gpu-01",
                "--token",
                spoof_token,
                "--state",
                str(node.state),
                "--trust",
                str(node.trust),
                "--exec",
            ],
            env=node.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        spoof.terminate()
        spoof.wait(10)
    assert run.returncode == 3 and "REFUSED" in run.stderr
    assert "keyset_untrusted" in run.stderr and "unknown_kid" in run.stderr
    assert node.state.read_bytes() == state_before and node.trust.read_bytes() == trust_before
    assert len(node.launches()) == 1  # nothing ran
    again = node.run()  # the genuine service: the genuine plan still boots
    assert again.returncode == 0, again.stderr
    assert len(node.launches()) == 2 and json.loads(node.state.read_text())["plan_id"] == plan["id"]


def test_rotation_reaches_the_node_through_the_signed_chain(fleet, db_url, tmp_path):
    url, c, node = fleet
    c.post("/v1/plans", json=PLAN)
    assert node.run().returncode == 0
    cli_env = {**os.environ, "PREFLIGHT_DATA_DIR": str(tmp_path / "var"), "PREFLIGHT_DATABASE_URL": db_url}
    old_kid = json.loads(node.trust.read_text())["keys"][0]["kid"]
    new_kid = subprocess.run(
        [PREFLIGHT, "keys", "rotate"], env=cli_env, capture_output=True, text=True, check=True
    ).stdout.strip()
    # the node's active plan is signed with the old key: retiring it now would stop the node from booting
    refused = subprocess.run([PREFLIGHT, "keys", "retire", old_kid], env=cli_env, capture_output=True, text=True)
    assert refused.returncode == 1 and "1 active plan(s) are signed with" in refused.stderr, refused.stderr
    plan = c.post("/v1/plans", json=PLAN).json()  # signed with the new key, which the node has never seen
    run = node.run()
    assert run.returncode == 0, run.stderr
    trust = json.loads(node.trust.read_text())
    assert trust["version"] == 2 and {k["kid"] for k in trust["keys"]} == {old_kid, new_kid}
    assert json.loads(node.state.read_text())["plan_id"] == plan["id"]
    # retiring the old key, now that no active plan is signed with it, follows the same path (signed by the new one)
    subprocess.run([PREFLIGHT, "keys", "retire", old_kid], env=cli_env, capture_output=True, check=True)
    assert node.run().returncode == 0
    trust = json.loads(node.trust.read_text())
    assert trust["version"] == 3 and [k["kid"] for k in trust["keys"]] == [new_kid]


def test_a_key_set_signed_by_an_unknown_key_is_refused(tmp_path):
    genuine, other = KeyStore(tmp_path / "g"), KeyStore(tmp_path / "o")
    path = tmp_path / "trust.json"
    path.write_text(json.dumps(genuine.jwks()))
    trust = Trust.load(path)
    other.rotate()
    with pytest.raises(VerificationError) as exc:
        trust.apply_chain(other.keysets(0))
    assert exc.value.reason == "keyset_untrusted"
    assert json.loads(path.read_text()) == genuine.jwks()  # untouched
    genuine.rotate()
    assert trust.apply_chain(genuine.keysets(0)) == [2]  # version 1 is already pinned
    with pytest.raises(VerificationError) as exc:  # a statement that skips a version
        Trust.load(tmp_path / "trust.json").apply_chain([other.keysets(0)[-1]])
    assert exc.value.reason in ("keyset_untrusted", "keyset_gap")


@pytest.mark.parametrize("name", ["PATH", "LD_PRELOAD", "PYTHONPATH", "LD_LIBRARY_PATH"])
def test_loader_and_interpreter_variables_are_refused_by_the_service(fleet, name):
    url, c, node = fleet
    r = c.post("/v1/plans", json={**PLAN, "env": {name: "/tmp/evil", "VLLM_LOGGING_LEVEL": "INFO"}})
    assert r.status_code == 422, r.text
    assert r.json()["errors"] == [
        {
            "field": f"env.{name}",
            "rule": "env_not_allowed",
            "message": "it changes which executable, loader or interpreter runs",
        }
    ]
    ok = c.post("/v1/plans", json={**PLAN, "env": {"VLLM_LOGGING_LEVEL": "INFO", "NCCL_DEBUG": "WARN"}})
    assert ok.status_code == 201, ok.text


def test_a_signed_plan_with_path_or_ld_preload_is_refused_by_the_agent(fleet, db_url, tmp_path):
    url, c, node = fleet
    c.post("/v1/plans", json=PLAN)
    evil = node.dir / "evil"
    evil.mkdir()
    (evil / "vllm").write_text("#!/bin/sh\necho PWNED > " + str(node.dir / "pwned") + "\n")
    (evil / "vllm").chmod(0o755)
    signed = rewrite_assignment(db_url, tmp_path / "var", "gpu-01", env={"PATH": str(evil), "LD_PRELOAD": "/tmp/x.so"})
    _served(url, "gpu-01", signed)
    run = node.run()
    assert run.returncode == 3 and "env_not_allowed" in run.stderr, run.stderr
    assert not (node.dir / "pwned").exists() and node.launches() == [] and not node.state.exists()
    refused = c.get("/v1/audit", params={"node": "gpu-01", "kind": "agent.refused"}).json()["items"]
    assert refused[0]["payload"]["details"]["reason"] == "env_not_allowed"


def test_the_node_chooses_the_vllm_executable(fleet, tmp_path):
    url, c, node = fleet
    c.post("/v1/plans", json=PLAN)
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "vllm").write_text((node.dir / "bin" / "vllm").read_text().replace("fh.write(", "fh.write('other ' + "))
    (other / "vllm").chmod(0o755)
    run = node.run("--vllm", str(other / "vllm"))
    assert run.returncode == 0, run.stderr
    assert node.launches()[0].startswith("other serve ")


def test_offline_boot_within_and_past_the_maximum_age(fleet, servers):
    url, c, node = fleet
    c.post("/v1/plans", json=PLAN)
    assert node.run().returncode == 0
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there: the service is unreachable
    offline = node.run(url=down)
    assert offline.returncode == 0, offline.stderr
    assert "OFFLINE BOOT" in offline.stderr and len(node.launches()) == 2
    pending = json.loads(node.state.read_text())["pending"]
    assert [p["status"] for p in pending] == ["started", "running", "exited"]
    saved = json.loads(node.state.read_text())
    node.state.write_text(json.dumps({**saved, "verified_at": saved["verified_at"] - 2}))  # confirmed 2 s earlier
    stale = node.run("--offline-max-age", "1", url=down)
    assert stale.returncode == 75 and "more than --offline-max-age 1" in stale.stderr
    assert len(node.launches()) == 2
    back = node.run()  # reachable again: the offline boot is reported
    assert back.returncode == 0, back.stderr
    assert json.loads(node.state.read_text())["pending"] == []
    runs = c.get("/v1/nodes/gpu-01/runs").json()["items"]
    assert [bool(r["offline_boot"]) for r in runs] == [False, True, False]
    assert runs[1]["offline_boot"]["age_seconds"] >= 0
    assert runs[1]["started_at"] < runs[2]["started_at"]


def test_print_delivers_what_an_offline_boot_queued(fleet):
    url, c, node = fleet
    c.post("/v1/plans", json=PLAN)
    assert node.run().returncode == 0
    offline = node.run(url=f"http://127.0.0.1:{free_port()}")
    assert offline.returncode == 0 and "OFFLINE BOOT" in offline.stderr, offline.stderr
    assert len(json.loads(node.state.read_text())["pending"]) == 3
    printed = node.run("--print")  # the same plan (nothing new to report): the queue still goes out
    assert printed.returncode == 0 and printed.stdout.startswith("vllm serve "), printed.stderr
    assert json.loads(node.state.read_text())["pending"] == []
    runs = c.get("/v1/nodes/gpu-01/runs").json()["items"]
    assert [bool(r["offline_boot"]) for r in runs] == [False, True] and len(node.launches()) == 2


def test_report_sequence_and_runs_across_two_plans_with_stop_and_heartbeat(fleet):
    url, c, node = fleet
    a = c.post("/v1/plans", json=PLAN).json()
    assert node.run().returncode == 0
    b = c.post("/v1/plans", json={**PLAN, "engine_args": {"max_model_len": 4096}}).json()
    proc = subprocess.Popen(
        node.args(None, "--heartbeat-seconds", "0.3"),
        env=node.env(FAKE_VLLM_MODE="serve"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 30
    while time.time() < deadline:
        runs = c.get("/v1/nodes/gpu-01/runs").json()["items"]
        if len(runs) == 2 and runs[1]["running_at"] and runs[1]["last_heartbeat_at"]:
            break
        time.sleep(0.2)
    assert runs[1]["ended_at"] is None and runs[1]["last_heartbeat_at"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    agent, _ = kinds(c)
    assert agent == [
        "agent.fetched",
        "agent.started",
        "agent.running",
        "agent.exited",
        "agent.fetched",
        "agent.started",
        "agent.running",
        "agent.stopped",
    ]
    runs = c.get("/v1/nodes/gpu-01/runs").json()["items"]
    assert [(r["plan_id"], r["seq"], r["end"]) for r in runs] == [(a["id"], 1, "exited"), (b["id"], 2, "stopped")]
    assert runs[1]["signal"] == "SIGTERM"
    # which plan ran at a given time: the API and the CLI
    at_a = runs[0]["started_at"]
    assert [r["plan_id"] for r in c.get("/v1/nodes/gpu-01/runs", params={"at": at_a}).json()["items"]] == [a["id"]]
    before = (dt.datetime.fromisoformat(runs[0]["started_at"]) - dt.timedelta(seconds=5)).isoformat()
    assert c.get("/v1/nodes/gpu-01/runs", params={"until": before}).json()["items"] == []
    assert c.get("/v1/nodes/gpu-01/runs", params={"at": at_a, "since": at_a}).status_code == 422


def test_audit_runs_cli(fleet, db_url, tmp_path):
    url, c, node = fleet
    a = c.post("/v1/plans", json=PLAN).json()
    assert node.run().returncode == 0
    b = c.post("/v1/plans", json={**PLAN, "engine_args": {"max_model_len": 4096}}).json()
    assert node.run().returncode == 0
    runs = c.get("/v1/nodes/gpu-01/runs").json()["items"]
    env = {**os.environ, "PREFLIGHT_DATABASE_URL": db_url, "PREFLIGHT_DATA_DIR": str(tmp_path / "var")}
    for run, plan in zip(runs, (a, b)):
        out = subprocess.run(
            [PREFLIGHT, "audit", "runs", "--node", "gpu-01", "--at", run["started_at"]],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.count("\n") == 1 and f"plan {plan['id']} seq {plan['assignments'][0]['seq']}" in out.stdout
    none = subprocess.run(
        [PREFLIGHT, "audit", "runs", "--node", "gpu-01", "--at", "2001-01-01T00:00:00Z"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert none.returncode == 1 and "nothing ran" in none.stdout


def test_corrupt_state_file_gives_a_clear_message_and_a_safe_default(fleet):
    url, c, node = fleet
    plan = c.post("/v1/plans", json=PLAN).json()
    node.state.write_text('{"last_seq": tru')
    run = node.run()
    assert run.returncode == 0, run.stderr
    assert "state file unusable" in run.stderr and "Traceback" not in run.stderr
    assert list(node.dir.glob("state.json.corrupt-*"))
    assert json.loads(node.state.read_text())["plan_id"] == plan["id"]
    reset = c.get("/v1/audit", params={"node": "gpu-01", "kind": "agent.reset"}).json()["items"]
    assert reset and reset[0]["payload"]["details"]["reason"] == "state_corrupt"
    node.state.write_text(json.dumps({"last_seq": True}))  # a JSON boolean is not a seq
    run = node.run()
    assert run.returncode == 0 and "'last_seq' has the wrong type" in run.stderr


def test_reset_on_purpose_is_recorded_then_the_genuine_plan_boots(fleet):
    url, c, node = fleet
    plan = c.post("/v1/plans", json=PLAN).json()
    node.state.write_text(json.dumps({"last_seq": 10**9, "plan_id": "spoofed"}))  # left by an older agent
    refused = node.run()
    assert refused.returncode == 3 and "replayed_seq" in refused.stderr
    reset = subprocess.run(
        [
            PREFLIGHT,
            "agent",
            "reset",
            "--server",
            url,
            "--node",
            "gpu-01",
            "--token",
            node.token,
            "--state",
            str(node.state),
            "--reason",
            "state poisoned by a spoofed server",
        ],
        env=node.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert reset.returncode == 0, reset.stderr
    [aside] = node.dir.glob("state.json.reset-*")  # set aside on purpose: not called corrupt
    assert f"previous state kept as {aside}" in reset.stdout and not list(node.dir.glob("state.json.corrupt-*"))
    events = c.get("/v1/audit", params={"node": "gpu-01", "kind": "agent.reset"}).json()["items"]
    assert events[0]["payload"]["details"]["previous"] == {"last_seq": 10**9, "plan_id": "spoofed"}
    run = node.run()
    assert run.returncode == 0, run.stderr
    assert json.loads(node.state.read_text())["plan_id"] == plan["id"]


def test_trust_remote_code_in_production_needs_the_manifest_to_allow_it(fleet):
    url, c, node = fleet
    body = {**PLAN, "engine_args": {**PLAN["engine_args"], "trust_remote_code": True}}
    r = c.post("/v1/plans", json=body)
    assert r.status_code == 422 and r.json()["errors"][0]["rule"] == "trust_remote_code_not_allowed"
    assert c.post("/v1/plans", json={**body, "environment": "benchmark"}).status_code == 201
    from tests.support import model_config

    m = c.post(
        "/v1/manifests",
        json={
            "name": "meta-llama/Llama-3.1-8B",
            "version": "2",
            "uri": "s3://llama-8b",
            "config": model_config("meta-llama__Meta-Llama-3.1-8B"),
            "allow_remote_code": True,
        },
    )
    assert m.status_code == 201 and m.json()["allow_remote_code"] is True
    assert c.post("/v1/plans", json={**body, "manifest": "meta-llama/Llama-3.1-8B@2"}).status_code == 201


def test_a_new_plan_reaches_a_running_node_through_its_heartbeat(fleet):
    url, c, node = fleet
    a = c.post("/v1/plans", json=PLAN).json()
    proc = subprocess.Popen(
        node.args(None, "--heartbeat-seconds", "0.3"),
        env=node.env(FAKE_VLLM_MODE="serve"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def runs():
            return c.get("/v1/nodes/gpu-01/runs").json()["items"]

        deadline = time.time() + 30
        while time.time() < deadline and not (runs() and runs()[0]["running_at"]):
            time.sleep(0.2)
        b = c.post("/v1/plans", json={**PLAN, "engine_args": {"max_model_len": 4096}}).json()
        while time.time() < deadline and not (len(runs()) == 2 and runs()[1]["running_at"]):
            time.sleep(0.2)
        items = runs()
        assert [(r["plan_id"], r["end"]) for r in items] == [(a["id"], "stopped"), (b["id"], None)]
        stopped = c.get("/v1/audit", params={"node": "gpu-01", "kind": "agent.stopped"}).json()["items"]
        assert stopped[0]["payload"]["details"]["reason"] == "superseded"
        assert [line.split("--max-model-len ")[1].split()[0] for line in node.launches()] == ["8192", "4096"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


@pytest.mark.parametrize(
    "keysets, plan, status, said",
    [
        (b'{"keysets": "x"}', b"not a jws", 200, ["keyset_malformed", "malformed: not a compact JWS"]),
        (b"[]", b"eyJhbGciOiJub25lIn0.e30.", 200, ["keyset_malformed", "alg_refused"]),
        (b"\xff\xfe", b'{"oops": true}', 200, ["keyset_malformed", "malformed"]),
        (b'{"keysets": []}', b"", 304, ["fetch failed: HTTP 304"]),
        (b'{"keysets": []}', b"A" * (2 << 20), 200, ["too_large"]),  # a 2 MiB "plan": read no further than 1 MiB
        (b'{"keysets": ["' + b"A" * (2 << 20) + b'"]}', b"x", 200, ["keyset_too_large", "malformed"]),
    ],
)
def test_hostile_server_answers_are_refused_without_a_traceback(tmp_path, keysets, plan, status, said):
    """A server that answers anything: the agent refuses, runs nothing, and leaves its state and trust as they were."""
    import http.server
    import threading

    class Hostile(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = keysets if self.path.startswith("/v1/keysets") else plan
            code = 200 if self.path.startswith("/v1/keysets") else status
            self.send_response(code)
            self.send_header("X-Plan-Id", "x" * 5000)
            self.send_header("X-Plan-Freshness", "a.b.c")
            self.send_header("Content-Length", str(len(body) if code != 304 else 0))
            self.end_headers()
            if code != 304:
                self.wfile.write(body)

        def do_POST(self):
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        node = Node.__new__(Node)
        node.name, node.token, node.dir = "gpu-01", "t" * 43, tmp_path / "node"
        (node.dir / "bin").mkdir(parents=True)
        (node.dir / "bin" / "vllm").write_text(FAKE_VLLM.format(py=PY))
        (node.dir / "bin" / "vllm").chmod(0o755)
        node.log, node.state, node.trust = node.dir / "vllm.log", node.dir / "state.json", node.dir / "trust.json"
        node.trust.write_text(json.dumps(KeyStore(tmp_path / "genuine").jwks()))
        node.state.write_text(json.dumps({"last_seq": 3, "plan_id": "p", "plan": None, "etag": '"e"'}))
        before = node.state.read_bytes(), node.trust.read_bytes()
        run = node.run(url=f"http://127.0.0.1:{srv.server_address[1]}")
    finally:
        srv.shutdown()
    assert run.returncode in (1, 3), run.stderr
    assert "Traceback" not in run.stderr and node.launches() == []
    assert all(reason in run.stderr for reason in said), run.stderr
    assert (node.state.read_bytes(), node.trust.read_bytes()) == before


class _Replay:
    """A network attacker's server: answers plan fetches with one captured genuine response, key-set fetches with
    the genuine key sets, and accepts reports."""

    def __init__(self, captured: httpx.Response, keysets: bytes):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                replay = not self.path.startswith("/v1/keysets")
                body = captured.content if replay else keysets
                self.send_response(200)
                if replay:
                    for name in ("ETag", "X-Plan-Id", "X-Plan-Seq", "X-Plan-Freshness"):
                        self.send_header(name, captured.headers[name])
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                self.send_response(201)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.srv.shutdown()


def test_a_captured_response_for_an_older_plan_is_refused(fleet):
    """A network attacker replays a genuine response (plan and freshness statement, still within its lifetime) for
    the node's previous plan: refused by seq, nothing runs, the state is untouched."""
    url, c, node = fleet
    c.post("/v1/plans", json=PLAN)
    captured = httpx.get(f"{url}/v1/nodes/gpu-01/plan", headers={"Authorization": f"Bearer {node.token}"})
    assert captured.status_code == 200 and captured.headers["x-plan-freshness"]
    keysets = httpx.get(f"{url}/v1/keysets").content
    c.post("/v1/plans", json={**PLAN, "engine_args": {"max_model_len": 4096}})
    assert node.run().returncode == 0  # the node runs the newer plan (seq 2)
    before = node.state.read_bytes()
    with _Replay(captured, keysets) as attacker:
        run = node.run(url=attacker.url)
    assert run.returncode == 3 and "replayed_seq" in run.stderr, run.stderr
    assert node.state.read_bytes() == before and len(node.launches()) == 1


def test_a_replayed_statement_does_not_restart_the_offline_clock(servers, tmp_path):
    """An attacker replays the current plan's genuine response (statement still unexpired) to restart the node's
    offline-boot clock: the statement does not echo the nonce of the node's fetch, so it is refused and the state is
    untouched; the offline-boot age still counts from when the service signed the last statement the node took. The
    service's clock runs 10 s behind the node's: what it signs now reaches the node as a statement signed 10 s
    ago."""
    (url,) = servers(1, clock=Behind(10))
    c = admin(url)
    node = Node(tmp_path, url, setup_fleet(c, ["gpu-01"])["gpu-01"])
    c.post("/v1/plans", json=PLAN)
    captured = httpx.get(f"{url}/v1/nodes/gpu-01/plan", headers={"Authorization": f"Bearer {node.token}"})
    keysets = httpx.get(f"{url}/v1/keysets").content
    assert node.run().returncode == 0
    before = node.state.read_bytes()
    assert json.loads(before)["verified_at"] < time.time() - 5  # the service's signing time, not the node's read
    with _Replay(captured, keysets) as attacker:
        run = node.run(url=attacker.url)
    assert run.returncode == 3 and "freshness_replayed" in run.stderr, run.stderr
    assert node.state.read_bytes() == before
    down = f"http://127.0.0.1:{free_port()}"
    stale = node.run("--offline-max-age", "2", url=down)
    assert stale.returncode == 75 and "more than --offline-max-age 2" in stale.stderr, stale.stderr
    assert len(node.launches()) == 1


def witnessed(c):
    """What the node's newest report says it saw of the audit log (the first report of each boot carries it)."""
    carried = [e for e in kinds(c)[1] if "audit_checkpoint" in (e["payload"].get("details") or {})]
    return carried[-1]["payload"]["details"]["audit_checkpoint"]


def test_the_node_keeps_an_audit_checkpoint_and_raises_the_alarm_when_the_chain_is_cut(fleet, db_url, tmp_path):
    """The agent keeps the longest signed audit checkpoint it has seen. Someone with the database and the service's
    data dir deletes the newest events, every stored checkpoint and the data-dir file, and has the service sign a
    checkpoint of the shorter chain (the service refuses while its recorded head is longer; with the keys, the head
    is moved back too): the next boot still runs the plan, but says the chain was cut, its report carries both
    checkpoints, and the node's copy shows the cut against the database."""
    from typer.testing import CliRunner

    from service.cli import app as cli

    url, c, node = fleet
    c.post("/v1/plans", json=PLAN)
    assert c.post("/v1/audit/checkpoints").status_code == 201
    first = node.run()
    assert first.returncode == 0, first.stderr
    copy = node.state.with_suffix(".checkpoint.jws")
    kept = json.loads(base64.urlsafe_b64decode(copy.read_text().split(".")[1] + "=="))
    assert witnessed(c)["status"] == "kept"

    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_events WHERE chain_seq >= :s"), {"s": kept["last_seq"]})
        conn.execute(text("DELETE FROM audit_checkpoints"))
    engine.dispose()
    (tmp_path / "var" / "audit-checkpoint.jws").unlink()
    refused = c.post("/v1/audit/checkpoints")  # the recorded head outlives the cut: nothing shorter is signed
    assert refused.status_code == 409 and "a cut tail" in refused.text, refused.text
    # the same hand holds the data dir's keys: it moves the recorded head back to the cut chain's end with a MAC
    # the service accepts, and the service signs a checkpoint of the shorter chain
    from service.audit import AuditKeys

    engine = create_engine(db_url)
    with engine.begin() as conn:
        seq, h = conn.execute(text("SELECT chain_seq, hash FROM audit_events ORDER BY chain_seq DESC LIMIT 1")).one()
        mac = AuditKeys(KeyStore(tmp_path / "var" / "keys", create=False)).head_mac(seq, h)
        conn.execute(text("UPDATE audit_head SET seq = :s, hash = :h, mac = :m"), {"s": seq, "h": h, "m": mac})
    engine.dispose()
    shorter = c.post("/v1/audit/checkpoints")
    assert shorter.status_code == 201, shorter.text
    assert shorter.json()["claims"]["last_seq"] < kept["last_seq"]

    again = node.run()
    assert again.returncode == 0 and len(node.launches()) == 2, again.stderr  # the boot is not held up
    assert "AUDIT ALARM" in again.stderr and "audit events were deleted" in again.stderr
    seen = witnessed(c)
    assert seen["status"] == "cut" and seen["kept"]["last_seq"] == kept["last_seq"]
    assert json.loads(base64.urlsafe_b64decode(copy.read_text().split(".")[1] + "=="))["last_seq"] == kept["last_seq"]

    env = {"PREFLIGHT_DATABASE_URL": db_url, "PREFLIGHT_DATA_DIR": str(tmp_path / "var")}
    out = CliRunner().invoke(cli, ["audit", "verify", "--checkpoint", str(copy)], env=env)
    assert out.exit_code == 1, out.stdout  # the chain grew again since, over other events: no longer the kept head
    assert json.loads(out.stdout)["checkpoint"]["source"] == str(copy)


def test_the_readme_stand_ins_boot_a_node_without_a_gpu(fleet):
    """README (the node agent): scripts/stand-ins holds an nvidia-smi replaying a real 8 × H100 node and a vllm that
    prints its arguments; first on PATH, `agent run --exec` boots the plan on a machine without a GPU."""
    url, c, node = fleet
    plan = c.post("/v1/plans", json=PLAN).json()
    stand_ins = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "stand-ins"
    env = {**node.env(), "PATH": f"{stand_ins}:{os.environ['PATH']}"}
    run = subprocess.run(node.args(), env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "stand-in vllm: serve " in run.stdout + run.stderr, (run.stdout, run.stderr)
    runs = c.get("/v1/nodes/gpu-01/runs").json()["items"]
    assert runs[0]["plan_id"] == plan["id"] and runs[0]["end"] == "exited"
