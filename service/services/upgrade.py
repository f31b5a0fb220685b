"""Upgrade impact: every active plan, and every manifest's newest plan, re-validated against another vLLM version —
what would break if the fleet's vLLM image were bumped (flags removed or renamed, quantization methods moved to
plugins, architectures dropped, defaults changed), with each finding's remedy."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..db.models import Assignment, Manifest, Plan
from ..domain.errors import DomainError
from ..domain.policy_profile import Profile
from ..domain.request import LaunchRequest
from ..domain.validate import validate
from ..domain.versions import resolve_version

MAX_PLANS = 2000  # bounded work per request: the newest plans first


def upgrade_impact(session: Session, vllm_version: str, *, policy: Profile | None = None) -> dict[str, Any]:
    """Raises DomainError (field ``vllm_version``) for a version outside every supported line. Each plan is judged
    under ``policy`` (the service's profile)."""
    version, line = resolve_version(vllm_version)
    active_ids = select(Assignment.plan_id).where(Assignment.status == "active").distinct()
    newest_per_manifest = select(func.max(Plan.created_at)).group_by(Plan.manifest_id)
    plans = session.execute(
        select(Plan, Manifest.name, Manifest.version)
        .join(Manifest, Manifest.id == Plan.manifest_id)
        .where((Plan.id.in_(active_ids)) | (Plan.created_at.in_(newest_per_manifest)))
        .order_by(Plan.created_at.desc())
        .limit(MAX_PLANS)
    ).all()
    nodes: dict[str, list[str]] = {}
    if plans:
        for plan_id, node in session.execute(
            select(Assignment.plan_id, Assignment.node_name).where(
                Assignment.plan_id.in_([p.id for p, _, _ in plans]), Assignment.status == "active"
            )
        ):
            nodes.setdefault(plan_id, []).append(node)
    items = []
    for plan, mname, mversion in plans:
        items.append(_judge(plan, f"{mname}@{mversion}", sorted(nodes.get(plan.id, [])), version, policy))
    breaking = [i for i in items if i["breaks"]]
    return {
        "vllm_version": version,
        "catalogue": line.newest,
        "checked": len(items),
        "breaking": len(breaking),
        "truncated": len(items) >= MAX_PLANS,
        "plans": breaking + [i for i in items if not i["breaks"]],
    }


def _judge(plan: Plan, manifest: str, nodes: list[str], version: str, policy: Profile | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "plan": plan.id,
        "status": plan.status,
        "manifest": manifest,
        "nodes": nodes,
        "from_version": plan.vllm_version,
        "to_version": version,
    }
    try:
        request = LaunchRequest.model_validate({**plan.request, "vllm_version": version})
        result = validate(request, fill=False, alternatives=False, policy=policy)
    except DomainError as e:
        return {
            **out,
            "breaks": True,
            "verdict": "invalid",
            "findings": [{"rule": e.rule, "severity": "error", "message": e.message, "field": e.field}],
        }
    except ValidationError as e:
        return {
            **out,
            "breaks": True,
            "verdict": "invalid",
            "findings": [{"rule": "invalid", "severity": "error", "message": str(e.errors()[:1])}],
        }
    return {
        **out,
        "breaks": result.verdict == "reject",
        "verdict": result.verdict,
        "findings": [f.as_dict() for f in result.errors],
        "argv": result.argv,
    }
