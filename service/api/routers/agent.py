"""The node agent's routes: fetch the node's signed plan, report its state. The fleet's hot path: ``create_app``
includes this router first (matched before any other route), and ``PlanServer.answer`` and ``report_answer`` answer
an agent's plain fetch and a valid report without FastAPI's routing (``CachedPlanFetch`` and ``AgentReports`` in
app.py); every error goes to these routes."""

import asyncio
import json
import re
import time
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError

from ... import metrics
from ...clock import Clock
from ...errors import ApiError, GroupHold, NotFound
from ...services import tokens as token_service
from ...services.agent_serving import etag_matches, fetch_recorded_recently
from ...services.agent_writes import AgentWrites, Fetch, Report
from ...services.epochs import EpochCache
from ...services.nodes import NOT_ACKNOWLEDGING
from ...settings import Settings
from ...signing import FRESHNESS_MEDIA_TYPE, NONCE_PATTERN, KeyStore, b64json, freshness_claims, plan_digest
from ..deps import NodeAgent, NodeName, Principals, Route, authorize_node, bearer_secret
from ..schemas import SIGNED_PLAN, ReportIn, ReportOut

router = APIRouter(route_class=Route)

FRESHNESS_CACHE_SECONDS = 60.0  # a freshness statement is re-signed per assignment at most this often
NONCE_RE = re.compile(NONCE_PATTERN)
GROUP_HOLD_RETRY_SECONDS = 5  # a held worker asks again (domain/group_gate.py): the head reports when vLLM starts
PLAN_HEADERS = {
    "ETag": {"description": "the plan's entity tag (send it as If-None-Match)", "schema": {"type": "string"}},
    "X-Plan-Id": {"description": "the plan id", "schema": {"type": "string"}},
    "X-Plan-Seq": {"description": "the node's seq of this plan", "schema": {"type": "integer"}},
    "X-Plan-Freshness": {
        "description": "compact JWS (typ application/vnd.preflight.freshness+jwt) signed at fetch "
        "time over the plan's digest, node and seq, the highest seq the node reported on (acked_seq) and "
        "the fetch's X-Plan-Nonce (nonce): the plan is the node's current one until its "
        "exp (PREFLIGHT_FRESHNESS_TTL_SECONDS)",
        "schema": {"type": "string"},
    },
}


def _signed_at(statement: str) -> tuple[int, str, str] | None:
    """(iat, kid, plan_digest) of a statement this service signed and stored itself (not verified here: it only
    decides whether the stored statement is young enough, and still about the stored plan, to serve instead of
    signing a new one)."""
    try:
        header, payload, _ = statement.split(".")
        claims, kid = b64json(payload), b64json(header)["kid"]
        iat, digest = claims["iat"], claims["plan_digest"]
    except (ValueError, KeyError, TypeError):
        return None
    return (iat, kid, digest) if type(iat) is int and type(kid) is str and type(digest) is str else None


def held(a: dict, principal: token_service.Principal | None) -> bool:
    """A multi-node worker's own agent waits for its head (an admin reading the node's plan is not held)."""
    return bool(a.get("hold")) and principal is not None and principal.role == "agent"


def etag_list(if_none_match: str | None) -> list[str]:
    return [t.strip() for t in if_none_match.split(",") if t.strip()] if if_none_match else []


class PlanServer:
    """A node's current plan from the per-process caches, one per app (``app.state.plan_server``): the plan cache
    (an EpochCache on the ``plans`` epoch: repeated fetches are answered from memory; a fetch that must be recorded
    — the first of an assignment, or a minute after the last record — always goes to the database) and the
    freshness statements signed per assignment."""

    def __init__(
        self, settings: Settings, keys: KeyStore, principals: Principals, plan_cache: EpochCache, clock: Clock
    ):
        self.settings, self.keys, self.principals, self.plan_cache = settings, keys, principals, plan_cache
        self.clock = clock
        self.freshness_cache: dict[int, tuple[float, str, str]] = {}  # assignment id -> (valid until, kid, statement)
        self.freshness_window = min(FRESHNESS_CACHE_SECONDS, settings.freshness_ttl_seconds / 10)

    def freshness(self, a: dict, nonce: str | None = None) -> str:
        """The freshness statement for a current assignment (signs.py ``freshness_claims``). With the agent's
        ``nonce``: signed for this fetch alone, echoing it (a replayed statement cannot carry the next fetch's
        nonce). Without: signed at most once per ``freshness_window`` per assignment and process — a small fraction
        of its lifetime —, so readers fetching at once cost a dictionary look-up, not a signature, per request."""
        now = self.clock.time()
        keys, freshness_cache, window = self.keys, self.freshness_cache, self.freshness_window
        keys.refresh_soon()  # a rotation or retirement made by the CLI reaches the cache within a second
        if nonce is not None:
            return self.sign_freshness(a, now, nonce)
        kid = keys.active_kid
        hit = freshness_cache.get(a["id"])
        if hit is not None and hit[0] > now and hit[1] == kid:
            return hit[2]
        if len(freshness_cache) > 200_000:
            freshness_cache.clear()
        stored = a.get("freshness")  # signed with the plan (services/plans.py ``create``)
        if stored:
            made = _signed_at(stored)
            if (
                made is not None
                and made[1] == kid
                and made[0] <= now < made[0] + window
                and made[2] == plan_digest(a["signed"])
            ):
                freshness_cache[a["id"]] = (made[0] + window, kid, stored)
                return stored
        statement = self.sign_freshness(a, now, None)
        freshness_cache[a["id"]] = (now + window, keys.active_kid, statement)
        return statement

    def sign_freshness(self, a: dict, now: float, nonce: str | None) -> str:
        settings = self.settings
        return self.keys.sign(
            freshness_claims(
                issuer=settings.issuer,
                audience=settings.audience,
                node=a["node_name"],
                plan_id=a["plan_id"],
                seq=a["seq"],
                digest=plan_digest(a["signed"]),
                ttl=settings.freshness_ttl_seconds,
                acked_seq=a.get("acked_seq") or 0,
                now=int(now),
                grouped=a.get("role") in ("head", "worker"),
                head_group_digest=a.get("head_group_digest"),
                nonce=nonce,
            ),
            typ=FRESHNESS_MEDIA_TYPE,
            refresh=False,
        )  # the caller's refresh_soon() keeps the key set current

    def plan_response(self, a: dict, served: bool, nonce: str | None = None) -> Response:
        headers = {
            "ETag": a["etag"],
            "Cache-Control": "no-cache",
            "X-Plan-Id": a["plan_id"],
            "X-Plan-Seq": str(a["seq"]),
            "X-Plan-Freshness": self.freshness(a, nonce),
        }
        if not served:
            metrics.AGENT_FETCHES.labels("not_modified").inc()
            return Response(status_code=304, headers=headers)
        return Response(a["signed"], media_type="application/jose", headers=headers)

    def from_plan_cache(
        self, name: str, principal: token_service.Principal | None, etags: list[str]
    ) -> tuple[dict | None, bool]:
        a = self.plan_cache.get(name) if principal is not None else None
        if a is None or principal is None:
            return None, False
        authorize_node(name, principal)
        if held(a, principal):  # the route answers the hold, from the cache (the head's report refreshes it)
            return a, False
        if etag_matches(a["etag"], etags):
            return a, False
        if principal.role == "agent" and not fetch_recorded_recently(a, self.clock):
            return None, False  # a delivery to record: the database
        metrics.AGENT_FETCHES.labels("served").inc()
        return a, True

    async def current(
        self, name: str, secret: str, tags: list[str], writes: AgentWrites
    ) -> tuple[token_service.Principal | None, dict | None, bool]:
        """(principal, the node's current assignment or None, served): from the caches, else from the database in
        the agents' group commit, which authenticates, reads and records the delivery (services/agent_writes.py);
        what it read is cached under the epochs seen before the read (services/epochs.py)."""
        principals = self.principals
        principal = principals.cached(secret)  # each call: a token revoked during a long-poll stops it
        a, served = self.from_plan_cache(name, principal, tags)
        if a is None:
            tags_seen = principals.cache.tag(), self.plan_cache.tag()  # before the read
            principal, a, served = await writes.fetch(Fetch(secret, principal, name, tuple(tags)))
            principals.cache.put(token_service.hash_token(secret), principal, tags_seen[0])
            if a is not None:
                self.plan_cache.put(name, a, tags_seen[1])
        return principal, a, served

    async def answer(
        self, name: str, authorization: str | None, if_none_match: str | None, nonce: str | None, writes: AgentWrites
    ) -> Response | None:
        """The route's answer to a fetch without ``wait`` — from the caches, or recorded through the group commit —
        when it is a plan or a 304, else None: the route answers errors (a nonce not of the form it accepts too), a
        held worker and a node without a plan (an error writes nothing, so the route asking again changes nothing
        but the cost of an error)."""
        if nonce is not None and not NONCE_RE.fullmatch(nonce):
            return None
        try:
            principal, a, served = await self.current(
                name, bearer_secret(authorization), etag_list(if_none_match), writes
            )
        except (ApiError, SQLAlchemyError):
            return None
        return self.plan_response(a, served, nonce) if a is not None and not held(a, principal) else None

    async def report_answer(self, name: str, authorization: str | None, body: bytes, writes: AgentWrites):
        """The report route's answer when the token's principal is cached and the body is a valid report: the same
        checks (node token for this node, ``ReportIn`` over the parsed JSON) and the same write, without FastAPI's
        routing and dependency resolution. None otherwise — the route answers (and reports) every error."""
        try:
            principal = self.principals.cached(bearer_secret(authorization))
            if principal is None:
                return None
            authorize_node(name, principal)
            r = ReportIn.model_validate(json.loads(body))
            out = await writes.report(Report(principal, name, r.plan_id, r.status, r.message, r.details))
        except (ApiError, ValueError, RecursionError, SQLAlchemyError):  # pydantic's ValidationError is a ValueError
            return None
        if r.status not in NOT_ACKNOWLEDGING:  # as the route does
            acknowledged(self.plan_cache, name, r.plan_id)
        return JSONResponse(out, status_code=201)


@router.get(
    "/v1/nodes/{name}/plan",
    operation_id="fetchNodePlan",
    tags=["agent"],
    response_class=Response,
    responses={
        200: {
            "content": {"application/jose": {"schema": SIGNED_PLAN}},
            "description": "the node's signed plan",
            "headers": PLAN_HEADERS,
        },
        304: {"description": "unchanged (If-None-Match matched)", "headers": PLAN_HEADERS},
        409: {
            "description": "group-hold: a multi-node worker's plan is withheld until its head "
            "reports the same plan started (problem+json with ``hold``, ``Retry-After``)",
            "content": {"application/problem+json": {}},
        },
    },
)
async def fetch_node_plan(
    request: Request,
    name: NodeName,
    authorization: Annotated[str | None, Header()] = None,
    if_none_match: Annotated[str | None, Header()] = None,
    wait: Annotated[int, Query(ge=0, le=300, description="long-poll seconds")] = 0,
    x_plan_nonce: Annotated[
        str | None,
        Header(
            pattern=NONCE_PATTERN,
            description="the agent's nonce for this fetch (16-64 base64url characters), echoed as ``nonce`` in the "
            "freshness statement, which is then signed for this fetch alone",
        ),
    ] = None,
):
    """The agent's fetch (the node's own agent token, or an admin's). With ``If-None-Match`` and ``wait`` > 0
    the call holds until a different plan is current (or ``wait`` seconds pass → 304). A booting agent's first
    call authenticates and fetches in one transaction, group-committed with other agents' fetches and reports
    (services/agent_writes.py). A worker of a multi-node group gets 409 ``group-hold`` (with ``hold``: reason,
    head, the head's last report; ``Retry-After``) until its head has reported the same plan ``started`` or
    ``running`` (domain/group_gate.py): it never starts against a head still on another plan."""
    state = request.app.state
    server: PlanServer = state.plan_server
    secret = bearer_secret(authorization, len(request.headers.getlist("authorization")))
    deadline = time.monotonic() + wait
    tags = etag_list(", ".join(request.headers.getlist("if-none-match")))  # repeated fields form one list
    while True:
        principal, a, served = await server.current(name, secret, tags, state.writes)
        if a is None or served or held(a, principal) or time.monotonic() >= deadline:
            break
        await asyncio.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
    if a is None:
        raise NotFound(f"node {name!r} has no current plan", field="name")
    if held(a, principal):
        metrics.AGENT_FETCHES.labels("held").inc()
        hold = a["hold"]
        raise GroupHold(
            hold["message"],
            retry_after=GROUP_HOLD_RETRY_SECONDS,
            hold={**hold, "plan_id": a["plan_id"], "seq": a["seq"]},
        )
    return server.plan_response(a, served, x_plan_nonce)


# the fleet's hot path answers the report as built (no response validation); the model documents it
@router.post(
    "/v1/nodes/{name}/reports",
    status_code=201,
    operation_id="reportNodeStatus",
    tags=["agent"],
    response_model=ReportOut,
)
async def report(request: Request, name: NodeName, body: ReportIn, p: NodeAgent):
    """The node agent's report (see ReportIn for the lifecycle). A ``heartbeat`` stores nothing but the time."""
    state = request.app.state
    out = await state.writes.report(Report(p, name, body.plan_id, body.status, body.message, body.details))
    if body.status not in NOT_ACKNOWLEDGING:
        acknowledged(state.plan_server.plan_cache, name, body.plan_id)
    return JSONResponse(out, status_code=201)


def acknowledged(plan_cache: EpochCache, name: str, plan_id: str | None) -> None:
    """The node reported on its cached current plan: the next freshness statement this process signs for it says so
    (``acked_seq``) without a database read. Other processes learn it when their cached entry expires or the plans
    epoch moves; until then theirs is lower, never above what the node acknowledged."""
    a = plan_cache.get(name)
    if a is not None and a["plan_id"] == plan_id and (a.get("acked_seq") or 0) < a["seq"]:
        a["acked_seq"] = a["seq"]
