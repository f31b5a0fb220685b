"""The tuning loop end to end: the real agent CLI runs the simulator (service/sim/vllm_sim.py) in place
of vllm, samples its /metrics on the plan's --port and posts windows to a live service; `preflight tune status` and
`preflight tune apply` move the node to the next plan, which the agent picks up at its next heartbeat and samples
in turn."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from tests.support import ADMIN
from tests.support.agent_node import Node
from tests.support.live import PREFLIGHT, PY, admin, free_port, setup_fleet

SIM_VLLM = """#!/bin/sh
exec {py} -m service.sim.vllm_sim "$@"
"""


def wait_for(check, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError("timed out")


def test_agent_samples_the_simulator_and_tune_apply_moves_the_node(servers, tmp_path):
    (url,) = servers(1)
    c = admin(url)
    tokens = setup_fleet(c, ["gpu-01"])
    port = free_port()
    plan = c.post(
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-8B",
            "nodes": ["gpu-01"],
            "engine_args": {"tensor_parallel_size": 1, "port": port},
            "workload": {"avg_seq_len": 600, "p99_seq_len": 2000, "stage": "initial"},
        },
    )
    assert plan.status_code == 201, plan.text
    plan = plan.json()
    mns = int(plan["argv"][plan["argv"].index("--max-num-seqs") + 1])
    node = Node(tmp_path, url, tokens["gpu-01"])
    (node.dir / "bin" / "vllm").write_text(SIM_VLLM.format(py=PY))  # the simulator stands in for vllm
    env = node.env(
        VLLM_SIM_KV_TOKENS=str(plan["budget"]["kv_cache_tokens"]),
        VLLM_SIM_SPEED="15",
        VLLM_SIM_WORKLOAD=json.dumps({"prompt": 400, "output": 200, "arrival_rate": 5000}),
        PYTHONPATH=os.getcwd(),
    )
    proc = subprocess.Popen(
        node.args(None, "--heartbeat-seconds", "0.5", "--metrics-seconds", "1"),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def decided():
            st = c.get("/v1/nodes/gpu-01/tuning").json()
            return st if st["next"] is not None else None

        st = wait_for(decided)
        assert st["plan"] == plan["id"] and st["action"] == "raise_max_num_seqs", st
        assert st["next"]["max_num_seqs"] == int(mns * 1.25)
        assert len(st["evidence"]) == 3 and all(w["num_requests_running"] == mns for w in st["evidence"])
        assert all(w["window_s"] >= 1 and w["e2e_p99_s"] is not None for w in st["evidence"])

        cli_env = {**os.environ, "PREFLIGHT_SERVER": url, "PREFLIGHT_TOKEN": ADMIN}
        shown = subprocess.run(
            [PREFLIGHT, "tune", "status", "gpu-01"], env=cli_env, capture_output=True, text=True, timeout=60
        )
        assert shown.returncode == 0, shown.stderr
        assert "raise_max_num_seqs" in shown.stdout and f"max_num_seqs {mns}" in shown.stdout
        applied = subprocess.run(
            [PREFLIGHT, "tune", "apply", "gpu-01"], env=cli_env, capture_output=True, text=True, timeout=60
        )
        assert applied.returncode == 0, applied.stderr
        assert f"--max-num-seqs {int(mns * 1.25)}" in applied.stdout
        new = c.get("/v1/plans", params={"node": "gpu-01", "status": "active"}).json()["items"][0]
        assert new["id"] != plan["id"]

        # the agent stops the superseded run at its next heartbeat, boots the new plan and samples it
        def sampled_new():
            st = c.get("/v1/nodes/gpu-01/tuning").json()
            return st if st["plan"] == new["id"] and st["evidence"] else None

        st = wait_for(sampled_new)
        assert st["evidence"][-1]["num_requests_running"] == int(mns * 1.25)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
