"""The GPU node inventory: register, hardware facts, list, read, update, rotate a node's agent token."""

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response

from ...db.session import after_commit
from ...services import fleet
from ...services import nodes as node_service
from ..deps import Admin, ContextDep, NodeFactsWriter, NodeName, Reader, Route, SessionDep
from ..schemas import (
    NodeFactsIn,
    NodeFactsOut,
    NodeIn,
    NodeListOut,
    NodeOut,
    NodeRegisteredOut,
    NodeTokenOut,
    NodeUpdate,
    NodeViewOut,
)

router = APIRouter(route_class=Route)


@router.post(
    "/v1/nodes", status_code=201, operation_id="registerNode", tags=["nodes"], response_model=NodeRegisteredOut
)
def register_node(body: NodeIn, session: SessionDep, p: Admin):
    """Register a GPU node (catalogue id, the name nvidia-smi prints, or an inline GPU description); the
    response carries the node's agent token, shown once."""
    gpu = body.gpu if isinstance(body.gpu, str) else body.gpu.model_dump()
    node, secret = node_service.register(
        session,
        actor=p.name,
        name=body.name,
        gpu=gpu,
        gpu_count=body.gpu_count,
        interconnect=body.interconnect,
        labels=body.labels,
        address=body.address,
    )
    return {**node_service.node_dict(node), "agent_token": secret}


@router.put(
    "/v1/nodes/{name}/facts",
    operation_id="putNodeFacts",
    tags=["nodes"],
    response_model=NodeFactsOut,
    responses={
        201: {
            "description": "The node was created; the body carries its agent token (shown once)",
            "model": NodeFactsOut,
        }
    },
)
def put_node_facts(
    request: Request,
    response: Response,
    name: NodeName,
    body: NodeFactsIn,
    session: SessionDep,
    p: NodeFactsWriter,
    ctx: ContextDep,
):
    """Create the node or update its hardware facts as nvidia-smi reads them (``preflight agent register``; the
    agent after inventory drift). Enroller or admin: any node, a new node gets its agent token, ``rotate_token``
    issues a new one. Agent: its own node, no token.

    ``gpu`` and ``gpu_count`` replace the stored ones; the optional ``interconnect``, ``gpus`` and ``address`` are
    merged: left out, the stored value stays; an explicit ``null`` clears it. The facts must agree with themselves
    (422 naming the field): ``gpus`` has ``gpu_count`` entries with distinct indices, all of the one model ``gpu``
    names (a node of mixed GPU models is refused). Names are refused when they hold control, invisible formatting
    or bidirectional characters (422 naming the field)."""
    node, created, secret = node_service.put_facts(
        session, actor=p.name, role=p.role, name=name, body=body, clock=ctx.clock
    )
    if secret is not None and not created:
        after_commit(session, request.app.state.principal_cache.clear)
    response.status_code = 201 if created else 200
    response.headers["ETag"] = node_service.etag(node)
    return {**node_service.node_dict(node), **({"agent_token": secret} if secret else {})}


@router.get("/v1/nodes", operation_id="listNodes", tags=["nodes"], response_model=NodeListOut)
def list_nodes(
    session: SessionDep,
    p: Reader,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    after: Annotated[str | None, Query(max_length=128)] = None,
):
    """Registered nodes by name, each with its current plan (``plan``: id, seq, model, verdict, predicted and
    measured KV tokens), the agent's ``last_report``, ``last_seen_at``, the plan the reports say runs
    (``running_plan_id``), ``drift`` and ``status`` (running, starting, failed, refused, stopped, stale,
    pending, unplanned). ``next`` is the cursor (pass it as ``after``)."""
    return fleet.list_nodes(session, limit=limit, after=after)


@router.get("/v1/nodes/{name}", operation_id="getNode", tags=["nodes"], response_model=NodeViewOut)
def get_node(response: Response, name: NodeName, session: SessionDep, p: Reader):
    """One node with its current plan and state, as in the listing; ``ETag`` for ``If-Match`` on update."""
    node = node_service.get(session, name)
    response.headers["ETag"] = node_service.etag(node)
    return fleet.get_node(session, name)


@router.patch(
    "/v1/nodes/{name}",
    operation_id="updateNode",
    tags=["nodes"],
    response_model=NodeOut,
    responses={412: {"description": "If-Match does not match the node's current ETag"}},
)
def update_node(
    response: Response,
    name: NodeName,
    body: NodeUpdate,
    session: SessionDep,
    p: Admin,
    ctx: ContextDep,
    if_match: Annotated[str | None, Header()] = None,
):
    """Change gpu_count, interconnect or labels; ``If-Match`` with the ETag of GET makes it a compare-and-set
    (412 when the node changed since)."""
    node = node_service.update(session, actor=p.name, name=name, if_match=if_match, update=body, clock=ctx.clock)
    response.headers["ETag"] = node_service.etag(node)
    return node_service.node_dict(node)


@router.post("/v1/nodes/{name}/token", operation_id="rotateNodeToken", tags=["nodes"], response_model=NodeTokenOut)
def rotate_node_token(request: Request, name: NodeName, session: SessionDep, p: Admin):
    """Revoke the node's agent token and issue a new one (shown once), without re-registering the node."""
    secret = node_service.rotate_token(session, actor=p.name, name=name)
    after_commit(session, request.app.state.principal_cache.clear)
    return {"name": name, "agent_token": secret}
