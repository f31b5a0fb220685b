"""State against the chain: every token, plan, assignment and rollout row must have the audit event that created
it. A row without one was written around the service (or its event was dropped, e.g. by a trigger): verify reports
it by table and id. Each table is one anti-join (set queries over indexed columns, no per-row loop in Python).

The events that create rows (``audit.append`` calls in service/services and service/api/routers):

- tokens: ``token.created`` (``subject`` ``token:<id>``, payload ``id``; the bootstrap admin token's older event has
  subject ``token:bootstrap-admin`` and no id: it covers the oldest bootstrap tokens, one each), ``token.rotated``
  (payload ``id`` from the tokens API, ``token_id`` from a node's rotation) and ``node.registered`` (payload
  ``token_id``: the node's first agent token; an older event without it covers the node's oldest agent token);
- plans: ``plan.created`` (``plan_id``); assignments: the ``plan.created`` of their plan naming their node in
  payload ``nodes``; rollouts: ``rollout.created`` (``subject`` ``rollout:<id>``).

Events name a node as it was spelt when they were written: migration 0014 rewrote node names in every table to
lower case without a final dot but left the hash-chained log as it was, so an event's node name is compared in that
canonical form (``lower(rtrim(name, '.'))``, the migration's own).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

BOOTSTRAP_LABEL = "bootstrap admin token"  # service/cli/server.py

_TOKENS = """
SELECT t.id FROM tokens t
WHERE NOT EXISTS (
    SELECT 1 FROM audit_events e
    WHERE e.subject = 'token:' || CAST(t.id AS VARCHAR(20)) AND e.kind = 'token.created')
  AND CAST(t.id AS VARCHAR(20)) NOT IN (
    SELECT CAST({payload_id} AS VARCHAR(20)) FROM audit_events
    WHERE kind IN ('token.created', 'token.rotated') AND {payload_id} IS NOT NULL
    UNION ALL
    SELECT CAST({payload_token_id} AS VARCHAR(20)) FROM audit_events
    WHERE kind IN ('token.rotated', 'node.registered') AND {payload_token_id} IS NOT NULL)
  AND NOT (t.role = 'agent'
    AND t.id IN (SELECT min(id) FROM tokens WHERE role = 'agent' GROUP BY node_name)
    AND t.node_name IN (
        SELECT lower(rtrim(e.node, '.')) FROM audit_events e
        WHERE e.kind = 'node.registered' AND {e_payload_token_id} IS NULL))
  AND t.id NOT IN (
    SELECT b.id FROM (
        SELECT id, row_number() OVER (ORDER BY id) AS n FROM tokens WHERE role = 'admin' AND label = :bootstrap
    ) b
    WHERE b.n <= (
        SELECT count(*) FROM audit_events
        WHERE kind = 'token.created' AND subject = 'token:bootstrap-admin' AND {payload_id} IS NULL))
ORDER BY t.id LIMIT :limit
"""

_PLANS = """
SELECT p.id FROM plans p
WHERE NOT EXISTS (SELECT 1 FROM audit_events e WHERE e.plan_id = p.id AND e.kind = 'plan.created')
ORDER BY p.id LIMIT :limit
"""

# the (plan, node) pairs the plan.created events name, built once and anti-joined (a hash join on PostgreSQL, an
# automatic index on SQLite) rather than looked up per assignment among each plan's many fetch and report events
_ASSIGNMENTS = """
SELECT a.id FROM assignments a
LEFT JOIN (
    SELECT e.plan_id AS plan_id, lower(rtrim(j.value, '.')) AS node FROM audit_events e, {nodes_of_e} AS j
    WHERE e.kind = 'plan.created' AND e.plan_id IS NOT NULL
) c ON c.plan_id = a.plan_id AND c.node = a.node_name
WHERE c.plan_id IS NULL
ORDER BY a.id LIMIT :limit
"""

_ROLLOUTS = """
SELECT r.id FROM rollouts r
WHERE NOT EXISTS (
    SELECT 1 FROM audit_events e WHERE e.subject = 'rollout:' || r.id AND e.kind = 'rollout.created')
ORDER BY r.id LIMIT :limit
"""

_DIALECT = {
    "sqlite": {
        "payload_id": "json_extract(payload, '$.id')",
        "payload_token_id": "json_extract(payload, '$.token_id')",
        "e_payload_token_id": "json_extract(e.payload, '$.token_id')",
        "nodes_of_e": "json_each(CASE WHEN json_type(e.payload, '$.nodes') = 'array' "
        "THEN json_extract(e.payload, '$.nodes') ELSE '[]' END)",
    },
    "postgresql": {
        "payload_id": "(payload ->> 'id')",
        "payload_token_id": "(payload ->> 'token_id')",
        "e_payload_token_id": "(e.payload ->> 'token_id')",
        "nodes_of_e": "json_array_elements_text(CASE WHEN json_typeof(e.payload -> 'nodes') = 'array' "
        "THEN e.payload -> 'nodes' ELSE '[]'::json END)",
    },
}

CREATED_BY = {
    "tokens": "token.created, token.rotated or node.registered",
    "plans": "plan.created",
    "assignments": "plan.created naming the node",
    "rollouts": "rollout.created",
}


def orphans(session: Session, limit: int = 100) -> list[dict[str, Any]]:
    """Rows of tokens, plans, assignments and rollouts with no event that created them (up to ``limit`` per
    table, lowest ids first): ``[{"table", "id", "missing"}]``."""
    words = _DIALECT.get(session.get_bind().dialect.name, _DIALECT["sqlite"])
    out: list[dict[str, Any]] = []
    for table, query in (
        ("tokens", _TOKENS),
        ("plans", _PLANS),
        ("assignments", _ASSIGNMENTS),
        ("rollouts", _ROLLOUTS),
    ):
        ids = session.execute(text(query.format(**words)), {"limit": limit, "bootstrap": BOOTSTRAP_LABEL}).scalars()
        out.extend({"table": table, "id": i, "missing": CREATED_BY[table]} for i in ids)
    return out
