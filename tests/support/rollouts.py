"""The staged-rollout tests' fleet: four 8 × H100 nodes planned with Llama-3.1-70B (OLD) and a rollout to NEW,
driven over HTTP, with the scheduler's tick called at the time a test means; the H200 pairs of the multi-node
group tests."""

from __future__ import annotations

import time

from sqlalchemy import func, select

from service.db.models import Assignment, AuditEvent
from service.services import rollouts as rollout_service
from service.services.context import Context
from tests.support.api import register_manifest, register_node

NODES = ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]
OLD = {"tensor_parallel_size": 8, "max_model_len": 8192, "gpu_memory_utilization": 0.9}
NEW = {"tensor_parallel_size": 8, "max_model_len": 16384, "gpu_memory_utilization": 0.9}


# the multi-node groups: DeepSeek-V3 at TP 16 over two pairs of 8 × H200
H200 = ["h200-a", "h200-b", "h200-c", "h200-d"]
TP16 = {"tensor_parallel_size": 16, "max_model_len": 32768}


class Fleet:
    """Four 8 × H100 nodes running Llama-3.1-70B at max_model_len 8192 (one plan, seq 1 on each)."""

    def __init__(self, api, db, settings, keys, nodes=NODES):
        self.api, self.db, self.settings, self.keys = api, db, settings, keys
        self.tokens = {n: register_node(api, n)["agent_token"] for n in nodes}
        register_manifest(api)
        r = api.post("/v1/plans", json={"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": nodes, "engine_args": OLD})
        assert r.status_code == 201, r.text
        self.old = r.json()

    def rollout(self, status=201, **extra):
        body = {
            "manifest": "meta-llama/Llama-3.1-70B@1",
            "engine_args": NEW,
            "nodes": NODES,
            "waves": [{"percent": 25, "bake_s": 60}, {"percent": 100}],
            "failure_limit": 0,
            "gates": {"ready_timeout_s": 300, "kv_tolerance": 0.2},
            **extra,
        }
        r = self.api.post("/v1/rollouts", json=body)
        assert r.status_code == status, r.text
        return r.json()

    def tick(self, at=None, db=None, **kw):
        return rollout_service.tick(
            db or self.db, Context(self.settings, self.keys), now=time.time() if at is None else at, **kw
        )

    def status(self, rid):
        r = self.api.get(f"/v1/rollouts/{rid}")
        assert r.status_code == 200, r.text
        return r.json()

    def report(self, node, plan_id, what, **details):
        r = self.api.post(
            f"/v1/nodes/{node}/reports",
            headers={"Authorization": f"Bearer {self.tokens[node]}"},
            json={"plan_id": plan_id, "status": what, "details": details},
        )
        assert r.status_code == 201, r.text

    def current(self, node):
        """(plan id, seq, argv) of the node's current plan, from the API."""
        n = self.api.get(f"/v1/nodes/{node}").json()["plan"]
        plan = self.api.get(f"/v1/plans/{n['id']}").json()
        return n["id"], n["seq"], plan["argv"]

    def assignments(self, node):
        with self.db.sessions() as s:
            return s.scalar(select(func.count()).select_from(Assignment).where(Assignment.node_name == node))

    def predicted(self, plan_id):
        return self.api.get(f"/v1/plans/{plan_id}").json()["budget"]["kv_cache_tokens"]

    def events(self, rid):
        with self.db.sessions() as s:
            return [
                (e.kind, e.node, e.payload)
                for e in s.execute(
                    select(AuditEvent).where(AuditEvent.subject == f"rollout:{rid}").order_by(AuditEvent.id)
                ).scalars()
            ]


class Died(Exception):
    """Raised from a tick's after_step hook: the worker dies between a step and its commit."""
