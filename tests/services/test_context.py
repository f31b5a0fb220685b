"""The services read the time from the app's clock (``create_app(clock=...)``, services/context.py): a test moves a
ManualClock instead of sleeping or patching the process's time."""

import datetime as dt

from fastapi.testclient import TestClient

from service.api.app import create_app
from service.clock import ManualClock
from tests.support import ADMIN
from tests.support.api import register_manifest, register_node

PLAN = {
    "manifest": "meta-llama/Llama-3.1-70B@1",
    "nodes": ["gpu-01"],
    "engine_args": {"tensor_parallel_size": 8, "max_model_len": 8192, "gpu_memory_utilization": 0.9},
}


def at(value: str) -> float:
    return dt.datetime.fromisoformat(value).timestamp()


def test_plans_and_their_revocation_are_stamped_by_the_apps_clock(settings, db, keys):
    clock = ManualClock(start=1_800_000_000.0)
    app = create_app(settings, db=db, keys=keys, clock=clock)
    assert app.state.clock is clock and app.state.context.clock is clock
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {ADMIN}"
        register_node(client)
        register_manifest(client)
        plan = client.post("/v1/plans", json=PLAN).json()
        assert at(plan["created_at"]) == 1_800_000_000.0
        clock.advance(3600)
        second = client.post("/v1/plans", json=PLAN).json()
        assert at(second["created_at"]) == 1_800_003_600.0
        listed = client.get("/v1/plans").json()["items"]
        assert [p["id"] for p in listed] == [second["id"], plan["id"]]  # newest first, by the clock's order
        clock.advance(60)
        assert client.post(f"/v1/plans/{second['id']}/revoke").status_code == 200
        [event] = client.get("/v1/audit", params={"kind": "plan.revoked"}).json()["items"]
        assert at(event["payload"]["at"]) == 1_800_003_660.0
