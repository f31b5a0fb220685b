"""Hardware inventory: register and read GPU nodes."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .. import audit
from ..api.schemas import NodeFactsIn, NodeUpdate
from ..clock import Clock, utc
from ..db.models import Assignment, Node, iso
from ..domain.errors import DomainError
from ..domain.gpus import resolve
from ..errors import Conflict, Invalid, NotFound
from . import tokens


def node_dict(n: Node) -> dict[str, Any]:
    return {
        "name": n.name,
        "gpu": n.gpu,
        "gpu_count": n.gpu_count,
        "interconnect": n.interconnect,
        "address": n.address,
        "labels": n.labels,
        "created_at": iso(n.created_at),
        **({"gpus": n.gpus} if n.gpus else {}),
    }


def register(
    session: Session,
    *,
    actor: str,
    name: str,
    gpu: str | dict,
    gpu_count: int,
    interconnect: str | None,
    labels: dict[str, str],
    address: str | None = None,
) -> tuple[Node, str]:
    """Register a node and issue its agent token (returned once). Raises DomainError for an unknown GPU and
    Conflict when the name is taken."""
    resolved = resolve(gpu, "gpu")
    # names arrive in lower case (api/schemas NodeNameStr); the unique index on lower(name) backs this up
    if session.execute(select(Node.id).where(func.lower(Node.name) == name.lower())).first():
        raise Conflict(f"node {name!r} already exists", field="name")
    node = Node(
        name=name,
        gpu_id=resolved.id,
        gpu=resolved.as_dict(),
        gpu_count=gpu_count,
        interconnect=interconnect,
        labels=labels,
        address=address,
    )
    session.add(node)
    try:
        session.flush()
    except IntegrityError:
        raise Conflict(f"node {name!r} already exists", field="name") from None
    secret, token = tokens.create(session, role="agent", node=name, label=f"agent token of {name}")
    audit.append(  # names the agent token it issued: verify finds the event of every token (audit/orphans.py)
        session,
        actor=actor,
        kind="node.registered",
        subject=f"node:{name}",
        node=name,
        payload={**node_dict(node), "token_id": token.id},
    )
    return node, secret


def distinct(names: list[str], field: str = "nodes") -> list[str]:
    """``names`` when no name appears twice; else Invalid naming the repeat (``nodes.J``): a node listed twice is a
    mistake in the caller's list (in a multi-node plan the order gives the ranks), never silently dropped."""
    first: dict[str, int] = {}
    for j, n in enumerate(names):
        if n in first:
            raise Invalid(
                f"node {n!r} is listed twice ({field}.{first[n]} and {field}.{j}): list each node once",
                field=f"{field}.{j}",
                errors=[
                    {
                        "field": f"{field}.{j}",
                        "rule": "duplicate_node",
                        "message": f"{n!r} already at {field}.{first[n]}",
                    }
                ],
            )
        first[n] = j
    return list(names)


def get(session: Session, name: str, *, for_update: bool = False) -> Node:
    """The node by name (row-locked until the transaction ends with ``for_update``). Raises NotFound."""
    q = select(Node).where(Node.name == name)
    if for_update:  # PostgreSQL FOR UPDATE; SQLite's BEGIN IMMEDIATE already holds the single write lock
        q = q.with_for_update()
    node = session.execute(q).scalar_one_or_none()
    if node is None:
        raise NotFound(f"node {name!r} is not registered", field="name")
    return node


def lock(session: Session, names: list[str]) -> None:
    """Row-lock the nodes (PostgreSQL ``FOR UPDATE``, in name order to avoid deadlocks) until the transaction
    ends; SQLite's single writer already serializes."""
    session.execute(select(Node.id).where(Node.name.in_(names)).order_by(Node.name).with_for_update()).all()


def list_nodes(session: Session, *, limit: int, after: str | None) -> list[Node]:
    q = select(Node).order_by(Node.name).limit(limit)
    if after:
        q = q.where(Node.name > after)
    return list(session.execute(q).scalars())


def rotate_token(session: Session, *, actor: str, name: str) -> str:
    """Revoke the node's agent tokens and issue a new one, without re-registering the node. The node row is locked,
    so concurrent rotations serialize and exactly one agent token stays live."""
    get(session, name, for_update=True)
    revoked = tokens.revoke_node_tokens(session, name)
    secret, row = tokens.create(session, role="agent", node=name, label=f"agent token of {name}")
    audit.append(
        session,
        actor=actor,
        kind="token.rotated",
        subject=f"node:{name}",
        node=name,
        payload={"revoked": revoked, "token_id": row.id},
    )
    return secret


def etag(n: Node) -> str:
    """Weak validator over the node's mutable fields."""
    return '"' + audit.sha256_hex(audit.canonical({**node_dict(n), "updated_at": iso(n.updated_at)}))[:32] + '"'


def update(session: Session, *, actor: str, name: str, if_match: str | None, update: NodeUpdate, clock: Clock) -> Node:
    """Update gpu_count / interconnect / address / labels (plans already signed keep the address they carry; a
    gpu_count that disagrees with the per-GPU list nvidia-smi read clears that list). With ``If-Match`` the current
    ETag must match (else 412). The row
    is read locked (``FOR UPDATE``), so concurrent conditional updates with one ETag serialize and only the first
    matches: a compare-and-set on both databases."""
    from ..errors import PreconditionFailed

    changes = update.model_dump(exclude_unset=True)  # a field left out keeps the stored value
    for key in ("gpu_count", "labels"):  # null is no value for either (NodeOut needs both; {} clears the labels)
        if key in changes and changes[key] is None:
            raise DomainError(key, f"{key} cannot be null" + (" (send {} to clear them)" if key == "labels" else ""))
    node = get(session, name, for_update=True)
    if if_match is not None and if_match.strip() not in ("*", etag(node)):
        raise PreconditionFailed(f"node {name!r} changed since you read it (ETag {etag(node)})", field="If-Match")
    before = node_dict(node)
    for key, value in changes.items():
        setattr(node, key, value)
    if node.gpus and len(node.gpus) != node.gpu_count:  # the per-GPU list nvidia-smi read no longer describes it
        node.gpus = None
    node.updated_at = utc(clock)
    session.flush()
    audit.append(
        session,
        actor=actor,
        kind="node.updated",
        subject=f"node:{name}",
        node=name,
        payload={"before": before, "after": node_dict(node)},
    )
    return node


# --- hardware facts as the node reads them ------------------------------------------------------------

FACT_FIELDS = ("interconnect", "gpus", "address")  # optional: omitted keeps the stored value, null clears it


def put_facts(
    session: Session, *, actor: str, role: str, name: str, body: NodeFactsIn, clock: Clock
) -> tuple[Node, bool, str | None]:
    """Create the node (an enroller or admin) or update its hardware facts (gpu, gpu_count, interconnect, the GPUs as
    nvidia-smi read them; ``address``, where the other nodes of a multi-node instance reach it). Returns ``(node,
    created, agent token or None)``: a token is issued when the node is created, or when ``rotate_token`` is asked
    by an enroller or admin (the node's other agent tokens are revoked). An agent may update only its own node and
    never rotates (the route checks who may call). Audited as node.registered / node.facts_updated with before and
    after.

    Only the fields the request sent count. ``gpu`` and ``gpu_count`` are required and replace the stored
    ones; the optional ``interconnect``, ``gpus`` and ``address`` are merged: left out, the stored value stays; an
    explicit null clears it. The result must agree with itself (domain/node_checks.py ``check_facts``: the per-GPU
    list has gpu_count GPUs, of one model, the model ``gpu`` names) — else DomainError naming the field, and
    nothing is written."""
    from ..domain.node_checks import check_facts
    from ..errors import Forbidden

    facts = body.model_dump(mode="json", exclude_unset=True)  # an omitted optional fact keeps the stored one
    gpu = facts["gpu"] = body.gpu if isinstance(body.gpu, str) else body.gpu.model_dump()
    resolved = resolve(gpu, "gpu")
    existing = session.execute(select(Node).where(Node.name == name).with_for_update()).scalar_one_or_none()
    if existing is None:
        if role == "agent":
            raise Forbidden(f"an agent token may not create node {name!r}")
        check_facts(gpu=resolved, gpu_count=facts["gpu_count"], gpus=facts.get("gpus"))
        node, secret = register(
            session,
            actor=actor,
            name=name,
            gpu=gpu,
            gpu_count=facts["gpu_count"],
            interconnect=facts.get("interconnect"),
            labels={},
            address=facts.get("address"),
        )
        node.gpus = facts.get("gpus")
        session.flush()
        return node, True, secret
    if facts.get("rotate_token") and role == "agent":
        raise Forbidden("an agent token may not rotate its node's token")
    merged = {k: facts[k] if k in facts else getattr(existing, k) for k in FACT_FIELDS}
    check_facts(gpu=resolved, gpu_count=facts["gpu_count"], gpus=merged["gpus"], kept="gpus" not in facts)
    before = node_dict(existing)
    after = {"gpu_id": resolved.id, "gpu": resolved.as_dict(), "gpu_count": facts["gpu_count"], **merged}
    if any(getattr(existing, k) != v for k, v in after.items()):  # a re-run with the same facts changes nothing
        for k, v in after.items():
            setattr(existing, k, v)
        existing.updated_at = utc(clock)
        session.flush()
        audit.append(
            session,
            actor=actor,
            kind="node.facts_updated",
            subject=f"node:{name}",
            node=name,
            payload={"before": before, "after": node_dict(existing)},
        )
    rotated = rotate_token(session, actor=actor, name=name) if facts.get("rotate_token") else None
    return existing, False, rotated


# A node's report on a plan other than these means its agent verified that plan (and saved its seq): ``refused`` may
# be a refusal of the plan itself, ``reset`` names no plan.
NOT_ACKNOWLEDGING = ("refused", "reset")


def acked_seqs(session: Session, names: list[str]) -> dict[str, int]:
    """Per node, the highest seq of its assignments its agent reported on (``last_report`` other than
    NOT_ACKNOWLEDGING): what the service knows the node already verified. Freshness statements carry it as
    ``acked_seq`` so an agent refuses an older plan even when its own state file was rolled back (agent/verify.py).
    Nodes without one are absent (0)."""
    if not names:
        return {}
    rows = session.execute(
        select(Assignment.node_name, func.max(Assignment.seq))
        .where(
            Assignment.node_name.in_(sorted(set(names))),
            Assignment.last_report.is_not(None),
            Assignment.last_report.not_in(NOT_ACKNOWLEDGING),
        )
        .group_by(Assignment.node_name)
    )
    return {node: int(seq) for node, seq in rows if seq is not None}
