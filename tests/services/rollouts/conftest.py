"""Fixtures of the staged-rollout tests: a service with the scheduler thread off (PREFLIGHT_ROLLOUT_TICK_SECONDS 0,
the tests call ``tick`` with the time they mean), an admin client, the H100 fleet and the H200 groups."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from tests.support import ADMIN
from tests.support.api import register_manifest
from tests.support.rollouts import H200, TP16, Fleet


@pytest.fixture
def quiet(settings):
    return settings.model_copy(update={"rollout_tick_seconds": 0})


@pytest.fixture
def api(quiet, db, keys):
    app = create_app(quiet, db=db, keys=keys)
    with TestClient(app) as c:
        c.headers["Authorization"] = f"Bearer {ADMIN}"
        yield c


@pytest.fixture
def fleet(api, db, quiet, keys):
    return Fleet(api, db, quiet, keys)


@pytest.fixture
def groups(api, db, quiet, keys):
    f = Fleet.__new__(Fleet)
    f.api, f.db, f.settings, f.keys = api, db, quiet, keys
    f.tokens = {}
    for i, n in enumerate(H200):
        r = api.post(
            "/v1/nodes",
            json={
                "name": n,
                "gpu": "h200-141gb",
                "gpu_count": 8,
                "interconnect": "nvlink",
                "address": f"10.0.0.{i + 1}",
            },
        )
        assert r.status_code == 201, r.text
        f.tokens[n] = r.json()["agent_token"]
    register_manifest(api, fixture="deepseek-ai__DeepSeek-V3", name="deepseek-ai/DeepSeek-V3")
    r = api.post(
        "/v1/plans",
        json={
            "manifest": "deepseek-ai/DeepSeek-V3@1",
            "nodes": H200,
            "engine_args": TP16,
            "group_env": [{"NCCL_SOCKET_IFNAME": "eth0"}, {"NCCL_SOCKET_IFNAME": "eth1"}],
        },
    )
    assert r.status_code == 201, r.text
    f.old = r.json()
    return f
