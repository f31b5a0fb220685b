"""Regressions on the agent boot path and hostile input."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from service.agent.client import AgentClient, AgentState, ResponseTooLarge, StateCorrupt
from service.domain.env_policy import refused


@pytest.mark.parametrize("name", ["CUDA_INJECTION64_PATH", "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH", "TRITON_HOME",
                                  "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "HF_HOME", "HF_ENDPOINT", "UCX_MODULE_DIR",
                                  "VLLM_CACHE_ROOT", "TORCH_HOME", "VLLM_USE_MODELSCOPE"])
def test_env_that_names_where_code_or_weights_come_from_is_refused(name):
    assert [n for n, _ in refused({name: "/tmp/evil"})] == [name]


@pytest.mark.parametrize("name", ["NCCL_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES", "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
                                  "HF_HUB_OFFLINE", "VLLM_ATTENTION_BACKEND", "NCCL_IB_HCA", "GLOO_SOCKET_IFNAME",
                                  "VLLM_PP_LAYER_PARTITION", "PYTORCH_CUDA_ALLOC_CONF", "OMP_NUM_THREADS"])
def test_ordinary_tuning_env_is_still_allowed(name):
    assert refused({name: "x"}) == []


def test_a_server_that_drips_bytes_is_unreachable_not_waited_on():
    def drip():
        for _ in range(50):
            time.sleep(0.05)
            yield b"x"

    transport = httpx.MockTransport(lambda req: httpx.Response(200, content=drip()))
    client = AgentClient("http://service", "n1", "t", transport=transport, timeout=0.1)
    with pytest.raises(httpx.ReadTimeout):
        client.fetch()


def test_a_compressed_answer_is_refused_before_it_is_expanded():
    import gzip

    bomb = gzip.compress(b"\0" * (8 << 20))
    transport = httpx.MockTransport(lambda req: httpx.Response(200, content=bomb,
                                                               headers={"Content-Encoding": "gzip"}))
    with pytest.raises(ResponseTooLarge):
        AgentClient("http://service", "n1", "t", transport=transport).fetch()


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_verified_at_is_a_corrupt_state(tmp_path, value):
    path = tmp_path / "state.json"
    path.write_text('{"last_seq": 1, "verified_at": %s}' % value)
    with pytest.raises(StateCorrupt):
        AgentState.load(path)


def test_late_reports_are_believed_only_within_the_window(client):
    from tests.support.api import PLAN, setup_fleet

    fleet = setup_fleet(client, ["gpu-01"])
    auth = {"Authorization": f"Bearer {fleet['gpu-01']['token']}"}
    old = fleet["gpu-01"]["plan"]["id"]
    assert client.post("/v1/plans", json={**PLAN, "nodes": ["gpu-01"]}).status_code == 201
    for at in (0, -1e300, 99999999999, time.time() - 40 * 86400):
        r = client.post("/v1/nodes/gpu-01/reports", headers=auth,
                        json={"plan_id": old, "status": "running", "details": {"at": at}})
        assert r.status_code == 409, (at, r.text)
    r = client.post("/v1/nodes/gpu-01/reports", headers=auth,
                    json={"plan_id": old, "status": "running", "details": {"at": time.time() - 600}})
    assert r.status_code == 201


def test_runs_in_a_past_window_show_how_they_ended(client):
    """A run that ended after the window asked about is not 'still running' (found by a fresh-user pass)."""
    from tests.support.api import setup_fleet

    fleet = setup_fleet(client, ["gpu-01"])
    auth = {"Authorization": f"Bearer {fleet['gpu-01']['token']}"}
    plan = fleet["gpu-01"]["plan"]["id"]

    def post(kind, run, **details):
        r = client.post("/v1/nodes/gpu-01/reports", headers=auth,
                        json={"plan_id": plan, "status": kind, "details": {"run_id": run, **details}})
        assert r.status_code == 201, r.text

    post("started", "r1")
    post("running", "r1")
    started = client.get("/v1/nodes/gpu-01/runs").json()["items"][0]["started_at"]
    time.sleep(0.01)
    post("stopped", "r1", signal="SIGTERM", status=0)
    at = client.get("/v1/nodes/gpu-01/runs", params={"at": started}).json()["items"]
    assert [(r["run_id"], r["end"]) for r in at] == [("r1", "stopped")] and at[0]["ended_at"]
    window = client.get("/v1/nodes/gpu-01/runs", params={"since": started, "until": started}).json()["items"]
    assert window == [] or window[0]["end"] == "stopped"
