"""The FastAPI application: routes, authentication by role, and one problem+json error contract."""


import asyncio
import contextlib
import datetime as dt
import hmac
import logging
import re
import threading
import time
import types
from typing import Annotated, Any, Callable, Literal

from fastapi import Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy import select, text
from sqlalchemy.exc import DataError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__, audit, metrics
from ..db.models import AuditEvent
from ..db.session import THREADS, Database, after_commit
from ..domain.errors import DomainError
from ..domain.request import LaunchRequest
from ..domain.validate import validate
from ..errors import ApiError, Busy, Conflict, Forbidden, NotFound, Unauthorized, Unavailable
from ..services import audit_export, calibration, fleet, history, idempotency
from ..services.agent_writes import AgentWrites, Fetch, Report
from ..services.epochs import EpochCache, EpochWatcher
from ..services import manifests as manifest_service
from ..services import nodes as node_service
from ..services import plans as plan_service
from ..services import tokens as token_service
from ..services import upgrade as upgrade_service
from ..settings import Settings
from ..signing import FRESHNESS_MEDIA_TYPE, KeyStore, b64json, freshness_claims, plan_digest
from . import docs, openapi_doc, ui
from .observability import Observability
from .schemas import NAME, ManifestIn, NodeFactsIn, NodeIn, NodeUpdate, PlanIn, ReportIn, TokenIn

log = logging.getLogger("preflight")
PROBLEM = "application/problem+json"
NodeName = Annotated[str, Path(pattern=NAME, description="Node name (hostname-like).")]
PRINCIPAL_CACHE_SECONDS = 60.0  # TTLs bound an entry's life; coherence comes from services/epochs.py
PLAN_CACHE_SECONDS = 30.0
FRESHNESS_CACHE_SECONDS = 60.0
PLAN_HEADERS = {
    "ETag": {"description": "the plan's entity tag (send it as If-None-Match)", "schema": {"type": "string"}},
    "X-Plan-Id": {"description": "the plan id", "schema": {"type": "string"}},
    "X-Plan-Seq": {"description": "the node's seq of this plan", "schema": {"type": "integer"}},
    "X-Plan-Freshness": {"description": "compact JWS (typ application/vnd.preflight.freshness+jwt) signed at fetch "
                         "time over the plan's digest, node and seq: the plan is the node's current one until its "
                         "exp (PREFLIGHT_FRESHNESS_TTL_SECONDS)", "schema": {"type": "string"}},
}  # a freshness statement is re-signed per assignment at most this often


def error_field(e: dict[str, Any]) -> str:
    """The field a validation error names: its location without the ``body`` prefix, extended by the path inside
    the value when a JSON check (domain/jsoncheck.py) or a nested validator said which part was wrong."""
    if e.get("type") == "json_invalid":
        return "body"
    loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
    inner = getattr((e.get("ctx") or {}).get("error"), "path", "")
    return ".".join(p for p in (loc, inner) if p) or "body"


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


def problem_response(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


class BodyLimit:
    """Refuse request bodies larger than ``limit`` bytes with 413 problem+json (declared or streamed)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = next((v for k, v in scope.get("headers") or () if k == b"content-length"), None)

        def too_big():
            return problem_response(413, {"type": "https://preflight.dev/problems/too-large",
                                          "title": "Payload too large", "status": 413,
                                          "detail": f"request body exceeds {self.limit} bytes"})

        if declared is not None:
            if declared.isdigit() and int(declared) > self.limit:
                return await too_big()(scope, receive, send)
            return await self.app(scope, receive, send)  # the server holds the client to its Content-Length
        # no Content-Length (chunked): read the body here, at most ``limit`` bytes, and hand the app a replay — an
        # error raised while the app reads it would be turned into a 400 by the body parser
        chunks: list[bytes] = []
        seen = 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return  # the client went away
            chunk = msg.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                return await too_big()(scope, receive, send)
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


class CachedPlanFetch:
    """ASGI fast path for an agent's repeated ``GET /v1/nodes/{name}/plan`` (no query string): when the per-process
    caches hold the answer — token and assignment cached under the current epochs, nothing to record — ``answer``
    builds the very response the route would, and it is sent without FastAPI's routing and parameter handling.
    Anything else (a miss, a fetch to record, a long-poll, any error) goes to the route."""

    PATH = re.compile(r"/v1/nodes/([A-Za-z0-9][A-Za-z0-9._-]{0,127})/plan")  # names as NodeIn allows
    ROUTE = types.SimpleNamespace(path="/v1/nodes/{name}/plan")  # the route label Observability records

    def __init__(self, app, answer: Callable[[str, str | None, str | None], Response | None]):
        self.app, self.answer = app, answer

    async def __call__(self, scope, receive, send):
        if (scope["type"] == "http" and scope["method"] == "GET" and not scope.get("query_string")
                and not scope.get("root_path")):
            m = self.PATH.fullmatch(scope["path"])
            if m is not None:
                auth: list[str] = []
                inm: list[str] = []
                for k, v in scope.get("headers") or ():
                    if k == b"authorization":
                        auth.append(v.decode("latin-1"))
                    elif k == b"if-none-match":
                        inm.append(v.decode("latin-1"))
                # exactly one Authorization field, or the route refuses it; repeated If-None-Match fields form one list
                response = self.answer(m.group(1), auth[0], ", ".join(inm)) if len(auth) == 1 else None
                if response is not None:
                    scope["route"] = self.ROUTE
                    return await response(scope, receive, send)
        return await self.app(scope, receive, send)


def create_app(settings: Settings, *, db: Database | None = None, keys: KeyStore | None = None) -> FastAPI:
    db = db or Database(settings.resolved_database_url)
    keys = keys or KeyStore(settings.key_dir, create=settings.env != "production")
    if db.audit_keys is None:  # every audit event this process writes carries a MAC the sealer checks
        db.audit_keys = audit.AuditKeys(keys)
    db.sealer.checkpointer = audit.Checkpointer(
        keys, settings.issuer, settings.checkpoint_file, every_events=settings.audit_checkpoint_events,
        every_seconds=settings.audit_checkpoint_seconds)
    writes = AgentWrites(db)  # the agents' fetches and reports, group-committed (services/agent_writes.py)
    watcher = EpochWatcher(db)  # keeps the agents' caches coherent across processes (services/epochs.py)
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        import anyio.to_thread

        anyio.to_thread.current_default_thread_limiter().total_tokens = THREADS  # = the database pool's size
        db.sealer.start()  # audit events are sealed into the chain by a background thread per process
        watcher.start()  # until it has polled once, the agents' caches stay unused
        try:
            yield
        finally:
            watcher.stop()
            writes.stop()  # answer what is queued before the last seal
            db.sealer.stop()

    app = FastAPI(title="Preflight", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Validates, signs and audits vLLM launch configurations before any GPU is touched.")
    app.state.db, app.state.keys, app.state.settings = db, keys, settings
    app.state.epochs = watcher

    # -- errors -----------------------------------------------------------------------------------------------
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError):
        retry = getattr(exc, "retry_after", None)
        return problem_response(exc.status, exc.problem(),
                                headers={"Retry-After": str(retry)} if retry is not None else None)

    @app.exception_handler(DomainError)
    async def _domain_error(_: Request, exc: DomainError):
        return problem_response(422, {"type": "https://preflight.dev/problems/invalid", "title": "Invalid request",
                                      "status": 422, "detail": exc.message, "errors": [exc.as_dict()]})

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        errors = [{"field": error_field(e), "rule": e.get("type"), "message": e.get("msg")} for e in exc.errors()]
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
        return problem_response(422, {"type": "https://preflight.dev/problems/invalid", "title": "Invalid request",
                                      "status": 422, "detail": detail, "errors": errors})

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        body = {"type": "about:blank", "title": str(exc.detail), "status": exc.status_code, "detail": str(exc.detail)}
        if exc.status_code == 400:
            body["errors"] = [{"field": "body", "rule": "unparseable", "message": str(exc.detail)}]
        return problem_response(exc.status_code, body, headers=getattr(exc, "headers", None))

    def request_id(request: Request) -> str | None:
        return request.scope.get("state", {}).get("request_id")

    @app.exception_handler(DataError)
    async def _data_error(request: Request, exc: Exception):
        # the database's own text stays in the log (with the request id), never in the response
        log.warning("value refused by the database: %s", str(getattr(exc, "orig", exc))[:300],
                    extra={"request_id": request_id(request), "path": request.url.path})
        return problem_response(422, {"type": "https://preflight.dev/problems/invalid", "title": "Invalid request",
                                      "status": 422, "detail": "a value cannot be stored (out of range or not "
                                      "representable)", "errors": [{"field": "body", "rule": "unstorable",
                                                                    "message": "a value cannot be stored"}]})

    @app.exception_handler(IntegrityError)
    async def _conflict(request: Request, exc: Exception):
        log.warning("integrity conflict: %s", str(getattr(exc, "orig", exc))[:300],
                    extra={"request_id": request_id(request), "path": request.url.path})
        return problem_response(409, {"type": "https://preflight.dev/problems/conflict", "title": "Conflict",
                                      "status": 409, "detail": "the change conflicts with one made at the same time; "
                                      "read the current state and retry"})

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    async def _db_down(request: Request, exc: Exception):
        log.error("database error: %s", exc.__class__.__name__,
                  extra={"request_id": request_id(request), "path": request.url.path})
        return problem_response(503, {"type": "https://preflight.dev/problems/unavailable",
                                      "title": "Service unavailable", "status": 503,
                                      "detail": "the database is unreachable; retry later"},
                                headers={"Retry-After": "5"})

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unhandled error", extra={"request_id": request_id(request), "path": request.url.path})
        return problem_response(500, {"type": "https://preflight.dev/problems/internal", "title": "Internal error",
                                      "status": 500, "detail": "an unexpected error; it has been logged"})

    # -- dependencies ---------------------------------------------------------------------------------------
    def session_dep():
        with db.transaction() as s:
            yield s

    # scope="function": the transaction commits when the route returns, before the response is sent (FastAPI's default
    # for a yield dependency would commit after it, so a client could act on an acknowledgement not yet durable)
    SessionDep = Annotated[Session, Depends(session_dep, scope="function")]

    # Per-process caches for the agents' hot path, coherent across processes (services/epochs.py): a token's
    # principal (a fleet booting at once fetches and reports with the same token) and a node's current assignment
    # (repeated fetches are answered from memory; a fetch that must be recorded — the first of an assignment, or a
    # minute after the last record — always goes to the database). A plan or token change made in any process
    # reaches every cache within epochs.POLL_SECONDS; in the process that made it, at once.
    principal_cache = EpochCache(watcher, "tokens", PRINCIPAL_CACHE_SECONDS)
    plan_cache = EpochCache(watcher, "plans", PLAN_CACHE_SECONDS)

    def bearer_secret(authorization: str | None, copies: int = 1) -> str:
        """The token of ``Authorization: Bearer <token>``. Raises Unauthorized when it is missing, not a bearer
        token, or sent more than once (``copies``: how many Authorization fields the request carried)."""
        if copies > 1:
            raise Unauthorized("several Authorization headers: send exactly one")
        if not authorization or not authorization.lower().startswith("bearer "):
            raise Unauthorized("missing bearer token: send Authorization: Bearer <token>")
        return authorization.split(" ", 1)[1].strip()

    def cached_principal(secret: str) -> token_service.Principal | None:
        """The admin token, or a cached look-up still fresh; None when the database must be asked."""
        if settings.admin_token and hmac.compare_digest(secret.encode(), settings.admin_token.encode()):
            return token_service.Principal(role="admin", name="admin")
        return principal_cache.get(token_service.hash_token(secret))

    def lookup_principal(secret: str) -> token_service.Principal:
        """Look the token up in the database and cache it. Raises Unauthorized."""
        tag = principal_cache.tag()
        with db.transaction() as session:
            p = token_service.authenticate(session, secret)
        if p is None:
            raise Unauthorized("unknown or revoked token")
        principal_cache.put(token_service.hash_token(secret), p, tag)
        return p

    async def principal_dep(request: Request,
                            authorization: Annotated[str | None, Header()] = None) -> token_service.Principal:
        """The caller, from ``Authorization: Bearer``. Async (no thread hop) when the look-up is cached; a miss runs
        one short transaction in the thread pool, so a long-poll holds no database connection."""
        secret = bearer_secret(authorization, len(request.headers.getlist("authorization")))
        return cached_principal(secret) or await run_in_threadpool(lookup_principal, secret)

    PrincipalDep = Annotated[token_service.Principal, Depends(principal_dep)]

    def require(*roles: str) -> Callable:
        async def check(p: PrincipalDep) -> token_service.Principal:
            if p.role not in roles:
                raise Forbidden(f"role {p.role} may not do this (needs {' or '.join(roles)})")
            return p
        return check

    authorize_node = token_service.authorize_node

    async def for_node(name: NodeName, p: PrincipalDep) -> token_service.Principal:
        return authorize_node(name, p)

    Admin = Annotated[token_service.Principal, Depends(require("admin"))]
    Deployer = Annotated[token_service.Principal, Depends(require("admin", "deployer"))]
    Reader = Annotated[token_service.Principal, Depends(require("admin", "deployer", "auditor"))]
    Auditor = Annotated[token_service.Principal, Depends(require("admin", "auditor"))]
    NodeAgent = Annotated[token_service.Principal, Depends(for_node)]
    READERS_AND_AGENTS = ("admin", "deployer", "auditor", "agent")  # every role but enroller

    async def for_node_facts(name: NodeName, p: PrincipalDep) -> token_service.Principal:
        """Issue 17: an enroller or admin may create a node or update any node's hardware facts; an agent only its
        own node's (after inventory drift)."""
        if p.role in ("admin", "enroller"):
            return p
        return authorize_node(name, p)

    ISO_TIME = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?(Z|[+-]\d{2}:\d{2})?$"
    TimeQuery = Annotated[str | None, Query(pattern=ISO_TIME, description="ISO 8601 time (UTC unless an offset is given)")]

    def parse_time(field: str, value: str | None) -> dt.datetime | None:
        if value is None:
            return None
        try:
            t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise DomainError(field, f"{field} {value!r} is not an ISO 8601 time") from None
        return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


    # -- agent (registered first: the fleet's hot path is matched before any other route) -----------------------------
    @app.get("/v1/nodes/{name}/plan", operation_id="fetchNodePlan", tags=["agent"],
             responses={200: {"content": {"application/jose": {}}, "description": "the node's signed plan",
                              "headers": PLAN_HEADERS},
                        304: {"description": "unchanged (If-None-Match matched)", "headers": PLAN_HEADERS}})
    async def fetch_node_plan(request: Request, name: NodeName, authorization: Annotated[str | None, Header()] = None,
                              if_none_match: Annotated[str | None, Header()] = None,
                              wait: Annotated[int, Query(ge=0, le=300, description="long-poll seconds")] = 0):
        """The agent's fetch (the node's own agent token, or an admin's). With ``If-None-Match`` and ``wait`` > 0
        the call holds until a different plan is current (or ``wait`` seconds pass → 304). A booting agent's first
        call authenticates and fetches in one transaction, group-committed with other agents' fetches and reports
        (services/agent_writes.py)."""
        secret = bearer_secret(authorization, len(request.headers.getlist("authorization")))
        deadline = time.monotonic() + wait
        tags = etag_list(", ".join(request.headers.getlist("if-none-match")))  # repeated fields form one list
        while True:
            principal = cached_principal(secret)  # each round: a token revoked during a long-poll stops it
            a, served = from_plan_cache(name, principal, tags)
            if a is None:
                tags_seen = principal_cache.tag(), plan_cache.tag()  # before the read (services/epochs.py)
                principal, a, served = await writes.fetch(Fetch(secret, principal, name, tuple(tags)))
                principal_cache.put(token_service.hash_token(secret), principal, tags_seen[0])
                if a is not None:
                    plan_cache.put(name, a, tags_seen[1])
            if a is None or served or time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
        if a is None:
            raise NotFound(f"node {name!r} has no current plan", field="name")
        return plan_response(a, served)

    freshness_cache: dict[int, tuple[float, str, str]] = {}  # assignment id -> (valid until, kid, statement)
    freshness_window = min(FRESHNESS_CACHE_SECONDS, settings.freshness_ttl_seconds / 10)

    def freshness(a: dict) -> str:
        """The freshness statement for a current assignment (signs.py ``freshness_claims``): signed at most once per
        ``freshness_window`` per assignment and process — a small fraction of its lifetime —, so a fleet fetching
        at once costs a dictionary look-up, not a signature, per request."""
        now = time.time()
        keys.refresh_soon()  # a rotation or retirement made by the CLI reaches the cache within a second
        kid = keys.active_kid
        hit = freshness_cache.get(a["id"])
        if hit is not None and hit[0] > now and hit[1] == kid:
            return hit[2]
        if len(freshness_cache) > 200_000:
            freshness_cache.clear()
        stored = a.get("freshness")  # signed with the plan (services/plans.py create)
        if stored:
            made = _signed_at(stored)
            if made is not None and made[1] == kid and made[0] <= now < made[0] + freshness_window \
                    and made[2] == plan_digest(a["signed"]):
                freshness_cache[a["id"]] = (made[0] + freshness_window, kid, stored)
                return stored
        statement = keys.sign(freshness_claims(
            issuer=settings.issuer, audience=settings.audience, node=a["node_name"], plan_id=a["plan_id"],
            seq=a["seq"], digest=plan_digest(a["signed"]), ttl=settings.freshness_ttl_seconds, now=int(now),
            grouped=a.get("role") in ("head", "worker"), head_group_digest=a.get("head_group_digest")),
            typ=FRESHNESS_MEDIA_TYPE, refresh=False)  # refresh_soon() above keeps the key set current
        freshness_cache[a["id"]] = (now + freshness_window, keys.active_kid, statement)
        return statement

    def plan_response(a: dict, served: bool) -> Response:
        headers = {"ETag": a["etag"], "Cache-Control": "no-cache", "X-Plan-Id": a["plan_id"],
                   "X-Plan-Seq": str(a["seq"]), "X-Plan-Freshness": freshness(a)}
        if not served:
            metrics.AGENT_FETCHES.labels("not_modified").inc()
            return Response(status_code=304, headers=headers)
        return Response(a["signed"], media_type="application/jose", headers=headers)

    def from_plan_cache(name: str, principal, etags: list[str]) -> tuple[dict | None, bool]:
        a = plan_cache.get(name) if principal is not None else None
        if a is None:
            return None, False
        authorize_node(name, principal)
        if plan_service.etag_matches(a["etag"], etags):
            return a, False
        if principal.role == "agent" and not plan_service.fetch_recorded_recently(a):
            return None, False  # a delivery to record: the database
        metrics.AGENT_FETCHES.labels("served").inc()
        return a, True

    def etag_list(if_none_match: str | None) -> list[str]:
        return [t.strip() for t in if_none_match.split(",") if t.strip()] if if_none_match else []

    def cached_answer(name: str, authorization: str | None, if_none_match: str | None) -> Response | None:
        """The route's answer when the caches hold it (no database, nothing to record), else None."""
        try:
            principal = cached_principal(bearer_secret(authorization))
            a, served = from_plan_cache(name, principal, etag_list(if_none_match))
        except ApiError:  # the route answers errors
            return None
        return plan_response(a, served) if a is not None else None

    @app.post("/v1/nodes/{name}/reports", status_code=201, operation_id="reportNodeStatus", tags=["agent"])
    async def report(name: NodeName, body: ReportIn, p: NodeAgent):
        """The node agent's report (see ReportIn for the lifecycle). A ``heartbeat`` stores nothing but the time."""
        out = await writes.report(Report(p, name, body.plan_id, body.status, body.message, body.details))
        return JSONResponse(out, status_code=201)

    # -- health and keys ---------------------------------------------------------------------------------------
    @app.get("/healthz", operation_id="healthz", tags=["ops"])
    def healthz():
        """The process is up (no database check: see /readyz)."""
        return {"status": "ok"}

    @app.get("/readyz", operation_id="readyz", tags=["ops"])
    def readyz():
        """Ready when the database answers and a signing key is loaded (else 503 problem+json)."""
        with db.sessions() as s:
            s.execute(text("SELECT 1"))
        if not keys.active_kid:
            raise Unavailable("no signing key loaded")
        return {"status": "ready", "database": "ok", "signing_key": keys.active_kid}

    @app.get("/metrics", operation_id="metrics", tags=["ops"], response_class=Response,
             responses={200: {"content": {"text/plain": {}}}})
    def metrics_endpoint():
        """Prometheus metrics: requests and latency per route, verdicts, findings by rule, agent fetches and
        reports, audit appends."""
        body, ctype = metrics.exposition()
        return Response(body, media_type=ctype)

    @app.get("/.well-known/jwks.json", operation_id="jwks", tags=["keys"])
    def jwks():
        """The published keys and their key-set ``version`` (save it on a node as its trust file)."""
        return keys.jwks()

    @app.get("/v1/keysets", operation_id="keysets", tags=["keys"])
    def keysets(after: Annotated[int, Query(ge=0, le=2**31, description="the version the node trusts")] = 0):
        """The key-set chain above version ``after``, oldest first: each statement (compact JWS, typ keyset+jwt)
        is version N of the published keys, signed by a key of version N-1. A node applies them in order to its
        trust file (service/agent/trust.py), so rotation and retirement reach it without re-provisioning."""
        chain = keys.keysets(after)  # refreshes first: a rotation made by the CLI is seen at once
        return {"version": keys.keyset_version, "keysets": chain}

    # -- inventory -------------------------------------------------------------------------------------------
    @app.post("/v1/nodes", status_code=201, operation_id="registerNode", tags=["nodes"])
    def register_node(body: NodeIn, session: SessionDep, p: Admin):
        """Register a GPU node (catalogue id, the name nvidia-smi prints, or an inline GPU description); the
        response carries the node's agent token, shown once."""
        gpu = body.gpu if isinstance(body.gpu, str) else body.gpu.model_dump()
        node, secret = node_service.register(session, actor=p.name, name=body.name, gpu=gpu,
                                             gpu_count=body.gpu_count, interconnect=body.interconnect,
                                             labels=body.labels, address=body.address)
        return {**node_service.node_dict(node), "agent_token": secret}

    @app.put("/v1/nodes/{name}/facts", operation_id="putNodeFacts", tags=["nodes"],
             responses={201: {"description": "The node was created; the body carries its agent token (shown once)"}})
    def put_node_facts(name: NodeName, body: NodeFactsIn, session: SessionDep,
                       p: Annotated[token_service.Principal, Depends(for_node_facts)]):
        """Create the node or update its hardware facts as nvidia-smi reads them (``preflight agent register``; the
        agent after inventory drift). Enroller or admin: any node, a new node gets its agent token, ``rotate_token``
        issues a new one. Agent: its own node, no token.

        ``gpu`` and ``gpu_count`` replace the stored ones; the optional ``interconnect``, ``gpus`` and ``address``
        are merged: left out, the stored value stays; an explicit ``null`` clears it. The facts must agree with
        themselves (422 naming the field): ``gpus`` has ``gpu_count`` entries with distinct indices, all of the one
        model ``gpu`` names (a node of mixed GPU models is refused). Names are refused when they hold control,
        invisible formatting or bidirectional characters (422 naming the field)."""
        facts = body.model_dump(mode="json", exclude_unset=True)  # an omitted optional fact keeps the stored one
        if not isinstance(body.gpu, str):
            facts["gpu"] = body.gpu.model_dump()
        node, created, secret = node_service.put_facts(session, actor=p.name, role=p.role, name=name, facts=facts)
        if secret is not None and not created:
            after_commit(session, principal_cache.clear)
        out = {**node_service.node_dict(node), **({"agent_token": secret} if secret else {})}
        return JSONResponse(out, status_code=201 if created else 200, headers={"ETag": node_service.etag(node)})

    @app.get("/v1/nodes", operation_id="listNodes", tags=["nodes"])
    def list_nodes(session: SessionDep, p: Reader, limit: Annotated[int, Query(ge=1, le=500)] = 100,
                   after: Annotated[str | None, Query(max_length=128)] = None):
        """Registered nodes by name, each with its current plan (``plan``: id, seq, model, verdict, predicted and
        measured KV tokens), the agent's ``last_report``, ``last_seen_at``, the plan the reports say runs
        (``running_plan_id``), ``drift`` and ``status`` (running, starting, failed, refused, stopped, stale,
        pending, unplanned). ``next`` is the cursor (pass it as ``after``)."""
        return fleet.list_nodes(session, limit=limit, after=after)

    @app.get("/v1/nodes/{name}", operation_id="getNode", tags=["nodes"])
    def get_node(name: NodeName, session: SessionDep, p: Reader):
        """One node with its current plan and state, as in the listing; ``ETag`` for ``If-Match`` on update."""
        node = node_service.get(session, name)
        return JSONResponse(fleet.get_node(session, name), headers={"ETag": node_service.etag(node)})

    @app.patch("/v1/nodes/{name}", operation_id="updateNode", tags=["nodes"],
               responses={412: {"description": "If-Match does not match the node's current ETag"}})
    def update_node(name: NodeName, body: NodeUpdate, session: SessionDep, p: Admin,
                    if_match: Annotated[str | None, Header()] = None):
        """Change gpu_count, interconnect or labels; ``If-Match`` with the ETag of GET makes it a compare-and-set
        (412 when the node changed since)."""
        changes = body.model_dump(exclude_unset=True)
        if "gpu_count" in changes and changes["gpu_count"] is None:
            raise DomainError("gpu_count", "gpu_count cannot be null")
        node = node_service.update(session, actor=p.name, name=name, if_match=if_match, changes=changes)
        return JSONResponse(node_service.node_dict(node), headers={"ETag": node_service.etag(node)})

    @app.get("/v1/nodes/{name}/history", operation_id="nodeHistory", tags=["audit"])
    def node_history(name: NodeName, session: SessionDep, p: Reader, limit: Annotated[int, Query(ge=1, le=500)] = 100,
                     before_seq: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None):
        """Plans assigned to the node, newest first: who approved them, what ran, when it was fetched, started,
        running or failed."""
        return history.node_history(session, name, limit=limit, before_seq=before_seq)

    @app.get("/v1/nodes/{name}/runs", operation_id="nodeRuns", tags=["audit"])
    def node_runs(name: NodeName, session: SessionDep, p: Reader, since: TimeQuery = None, until: TimeQuery = None,
                  at: TimeQuery = None):
        """Which plan ran on the node in ``[since, until)`` (or at the instant ``at``): one item per run of vLLM
        with its plan, seq, manifest and argv, start, running and end times, how it ended (``stopped``,
        ``exited`` with its status, ``interrupted`` by the node's next start, or null: still running, with the last
        heartbeat)."""
        if at is not None and (since is not None or until is not None):
            raise DomainError("at", "give either at or since/until")
        t = parse_time("at", at)
        lo, hi = (t, t + dt.timedelta(microseconds=1)) if t else (parse_time("since", since), parse_time("until", until))
        if lo and hi and hi < lo:
            raise DomainError("until", "until is before since")
        return history.node_runs(session, name, since=lo, until=hi)

    @app.post("/v1/nodes/{name}/token", operation_id="rotateNodeToken", tags=["nodes"])
    def rotate_node_token(name: NodeName, session: SessionDep, p: Admin):
        """Revoke the node's agent token and issue a new one (shown once), without re-registering the node."""
        secret = node_service.rotate_token(session, actor=p.name, name=name)
        after_commit(session, principal_cache.clear)
        return {"name": name, "agent_token": secret}

    # -- manifests --------------------------------------------------------------------------------------------
    @app.post("/v1/manifests", status_code=201, operation_id="registerManifest", tags=["manifests"])
    def register_manifest(body: ManifestIn, p: Deployer,
                          idempotency_key: Annotated[str | None, Header(max_length=256)] = None):
        """Register a model version's weight manifest (config.json, quantization tag, layout, size, URI). Refused
        (422) when its tag and quantization configs disagree; ``Idempotency-Key`` makes a retry safe."""
        data = body.model_dump(mode="json")
        status, out, replayed = idempotency.run(
            db, route="POST /v1/manifests", principal=p.name, key=idempotency_key, body=data, status_code=201,
            action=lambda s: manifest_service.manifest_dict(manifest_service.register(s, actor=p.name, body=data)))
        return JSONResponse(out, status_code=status, headers={"Idempotent-Replayed": "true"} if replayed else None)

    @app.get("/v1/manifests", operation_id="listManifests", tags=["manifests"])
    def list_manifests(session: SessionDep, p: Reader, limit: Annotated[int, Query(ge=1, le=500)] = 100,
                       after: Annotated[int | None, Query(ge=0, le=2**62)] = None):
        """Registered manifests by id; ``next`` is the cursor (pass it as ``after``)."""
        rows = manifest_service.list_manifests(session, limit=limit, after=after)
        return {"items": [manifest_service.manifest_dict(m) for m in rows],
                "next": rows[-1].id if len(rows) == limit else None}

    @app.get("/v1/manifests/{ref:path}", operation_id="getManifest", tags=["manifests"])
    def get_manifest(ref: str, session: SessionDep, p: Reader):
        """A manifest by id, ``name@version`` or ``name`` (its newest version); names may contain ``/``."""
        m = manifest_service.resolve_ref(session, int(ref) if ref.isdigit() and len(ref) < 19 else ref)
        return manifest_service.manifest_dict(m, full=True)

    # -- validation and plans ------------------------------------------------------------------------------
    @app.post("/v1/validate", operation_id="validateLaunch", tags=["plans"])
    def validate_launch(body: LaunchRequest, p: Reader):
        """Judge a launch given inline (config.json object, hardware, engine args, workload): the verdict, findings
        with remedies, the budget, recommendations and the argv. Stores nothing (see createPlan ``dry_run`` to judge
        by manifest and node names)."""
        if body.model.path is not None:
            raise DomainError("model.path", "model.path is for the CLI; send config (the config.json object)")
        out = validate(body).as_dict()
        metrics.observe_result("validate", out["verdict"], out["findings"])
        return out

    @app.get("/v1/upgrade-impact", operation_id="upgradeImpact", tags=["plans"])
    def upgrade_impact(session: SessionDep, p: Reader,
                       vllm_version: Annotated[str, Query(min_length=1, max_length=32)]):
        """Every active plan and every manifest's newest plan re-validated against ``vllm_version``: what would
        break on upgrade (or downgrade), with findings and remedies. Breaking plans first."""
        return upgrade_service.upgrade_impact(session, vllm_version)

    @app.post("/v1/plans", status_code=201, operation_id="createPlan", tags=["plans"],
              responses={200: {"description": "dry run: the verdict, findings, budget and argv; nothing stored"}})
    def create_plan(body: PlanIn, p: Deployer,
                    idempotency_key: Annotated[str | None, Header(max_length=256)] = None,
                    dry_run: Annotated[bool, Query(description="validate and render only: no plan, no seq, no "
                                                               "audit event (200, or 422 when rejected)")] = False):
        """Validate a launch for a registered manifest on registered nodes, sign one plan per node and make it each
        node's current plan (the previous one is superseded). 422 with findings and remedies when vLLM would refuse
        it; nothing is stored then. With ``dry_run=true`` nothing is ever stored."""
        data = body.model_dump(mode="json")
        if dry_run:
            with db.read() as session:
                return JSONResponse(fleet.dry_run(session, data))
        status, out, replayed = idempotency.run(
            db, route="POST /v1/plans", principal=p.name, key=idempotency_key, body=data, status_code=201,
            action=lambda s: plan_service.create(s, actor=p.name, settings=settings, keys=keys, body=data))
        plan_cache.clear()
        return JSONResponse(out, status_code=status, headers={"Idempotent-Replayed": "true"} if replayed else None)

    @app.get("/v1/plans", operation_id="listPlans", tags=["plans"])
    def list_plans(request: Request, session: SessionDep, p: Reader,
                   node: Annotated[str | None, Query(max_length=128)] = None,
                   model: Annotated[str | None, Query(max_length=256)] = None,
                   status: Annotated[Literal["active", "superseded", "revoked"] | None, Query()] = None,
                   since: TimeQuery = None, until: TimeQuery = None,
                   limit: Annotated[int, Query(ge=1, le=500)] = 100,
                   after: Annotated[str | None, Query(max_length=36, description="the previous page's next")] = None):
        """Plans, newest first, filtered by node (assigned to it), model (manifest name), status and creation time
        (``since`` inclusive, ``until`` exclusive); ``next`` is the cursor (pass it as ``after``). Env values are
        redacted and the JWS left out for auditors."""
        unknown = sorted(set(request.query_params) - {"node", "model", "status", "since", "until", "limit", "after"})
        if unknown:  # a misspelt filter would silently list everything
            raise DomainError(f"query.{unknown[0]}" if unknown[0] else "query",
                              f"unknown query parameter {unknown[0]!r} (filters: node, model, status, since, until; "
                              f"limit, after)")
        lo, hi = parse_time("since", since), parse_time("until", until)
        if lo and hi and hi < lo:
            raise DomainError("until", "until is before since")
        return fleet.list_plans(session, node=node, model=model, status=status, since=lo, until=hi, limit=limit,
                                after=after, secrets=p.role in ("admin", "deployer"))

    @app.get("/v1/plans/{plan_id}", operation_id="getPlan", tags=["plans"])
    def get_plan(plan_id: str, session: SessionDep, p: Reader):
        """One plan with its findings, budget, argv and command, and its assignments (node, seq, status, last
        report). Env values and the signed JWS only for admins and deployers."""
        plan, assignments = plan_service.get(session, plan_id)
        # env values may be secrets: only admins and deployers see them (and the signed JWS, which carries them)
        return plan_service.plan_dict(plan, assignments, secrets=p.role in ("admin", "deployer"))

    @app.get("/v1/plans/{plan_id}/placements", operation_id="planPlacements", tags=["audit"])
    def plan_placements(plan_id: str, session: SessionDep, p: Reader):
        """Where one plan went: per node, when it was assigned, fetched, started, running, stopped or exited."""
        return history.plan_placements(session, plan_id)

    @app.post("/v1/plans/{plan_id}/revoke", operation_id="revokePlan", tags=["plans"])
    def revoke_plan(plan_id: str, session: SessionDep, p: Deployer):
        """Withdraw a plan: its nodes' next heartbeat answer says it is no longer current and the agents stop it."""
        out = plan_service.plan_dict(plan_service.revoke(session, actor=p.name, plan_id=plan_id))
        after_commit(session, plan_cache.clear)
        return out

    @app.post("/v1/plans/{plan_id}/reissue", status_code=201, operation_id="reissuePlan", tags=["plans"])
    def reissue_plan(plan_id: str, session: SessionDep, p: Deployer):
        """Rollback: re-validate an earlier plan's content and issue it as a new plan with a new seq per node
        (an old JWS is never re-served)."""
        out = plan_service.reissue(session, actor=p.name, settings=settings, keys=keys, plan_id=plan_id)
        after_commit(session, plan_cache.clear)
        return out

    # -- audit -------------------------------------------------------------------------------------------------
    def audit_query(node, plan, model, kind, since, until):
        since, until = parse_time("since", since), parse_time("until", until)
        q = select(AuditEvent).order_by(AuditEvent.id)
        for col, value in ((AuditEvent.node, node), (AuditEvent.plan_id, plan), (AuditEvent.model, model),
                           (AuditEvent.kind, kind)):
            if value:
                q = q.where(col == value)
        if since:
            q = q.where(AuditEvent.ts >= since)
        if until:
            q = q.where(AuditEvent.ts < until)
        return q

    @app.get("/v1/audit", operation_id="listAudit", tags=["audit"])
    def list_audit(p: Auditor, node: str | None = None, plan: str | None = None,
                   model: str | None = None, kind: str | None = None, since: TimeQuery = None,
                   until: TimeQuery = None, after: Annotated[int, Query(ge=0, le=2**62)] = 0,
                   limit: Annotated[int, Query(ge=1, le=1000)] = 100):
        """Audit events in the order they were written, filtered; ``next`` is the cursor (pass it as ``after``).
        Each event carries its chain position ``seq`` and ``hash`` (null for the moment before it is sealed)."""
        q = audit_query(node, plan, model, kind, since, until).where(AuditEvent.id > after).limit(limit)
        with db.transaction() as session:
            rows = list(session.execute(q).scalars())
        return {"items": [audit.event_dict(e) for e in rows], "next": rows[-1].id if len(rows) == limit else None}

    @app.get("/v1/audit/export", operation_id="exportAudit", tags=["audit"],
             responses={200: {"content": {"application/x-ndjson": {}, "text/csv": {}}}})
    def export_audit(p: Auditor, format: Annotated[str, Query(pattern="^(jsonl|csv)$")] = "jsonl",
                     node: str | None = None, plan: str | None = None, model: str | None = None,
                     kind: str | None = None, since: TimeQuery = None, until: TimeQuery = None):
        """The filtered audit log as JSON Lines or CSV, streamed in chain order."""
        db.sealer.flush()
        q = audit_query(node, plan, model, kind, since, until)
        media = "application/x-ndjson" if format == "jsonl" else "text/csv"
        return StreamingResponse(audit_export.stream(db, q, format), media_type=media)

    verifying = app.state.audit_verifying = threading.Lock()

    @app.get("/v1/audit/verify", operation_id="verifyAudit", tags=["audit"])
    def verify_audit(p: Auditor):
        """Recompute the whole chain, read-only (verify never seals): every link, hash and MAC, rows not in the chain
        (``pending``; ``forged`` for rows the service did not write), and the chain against the newest signed
        checkpoint (stored, and the data-dir copy): ``{"ok", "events", "head", "pending", "checkpoint"}``, or
        ``ok`` false with ``first_broken``, ``forged`` or ``checkpoint.reason`` (a cut tail, an emptied table,
        swapped ids). Waits up to 2 s for this process's sealer to chain what was just written."""
        return verify_chain_now()

    def verify_chain_now() -> dict:
        """One read-only pass over the whole chain (the API's and the operators' page's verify). Raises Busy."""
        if not verifying.acquire(blocking=False):  # one whole-chain pass per process at a time: bounded work
            raise Busy("a verification of the audit chain is already running in this process; retry shortly",
                       retry_after=5)
        try:
            db.sealer.flush()
            # what this process had sealed before the snapshot opens: all of it is in the snapshot (a seal raises
            # high_water only after it committed), while seals that commit during the read are not — reading it
            # afterwards called those "deleted"
            seen = db.sealer.high_water
            with db.read() as session:  # one snapshot, no write lock: agents and deploys go on while it reads
                found, problems = audit.known_checkpoints(session, keys.jwks(), [settings.checkpoint_file])
                out = audit.verify_chain(session, checkpoints=found)
        finally:
            verifying.release()
        if out["ok"] and out["last_seq"] < seen:  # after the newest checkpoint, before this process restarted
            out["ok"] = False
            out["cut"] = {"seen_seq": seen, "reason": f"this service sealed the chain up to seq {seen}, it now ends "
                                                      f"at {out['last_seq']}: events were deleted"}
        if problems:
            out["warnings"] = problems
        out.pop("last_seq", None)
        return out

    app.state.verify_audit = verify_chain_now

    def checkpoint_body(row) -> dict:
        from ..agent.verify import VerificationError, verify_jws

        try:
            claims, _ = verify_jws(row.signed, keys.jwks(), typ=audit.CHECKPOINT_TYPE)
        except VerificationError:  # signed with a key retired since: still served, the caller judges it
            claims = None
        return {"checkpoint": row.signed, "claims": claims}

    @app.post("/v1/audit/checkpoints", status_code=201, operation_id="createAuditCheckpoint", tags=["audit"])
    def create_checkpoint(p: Auditor):
        """A signed checkpoint of the chain now (compact JWS, typ audit-checkpoint: its length, head hash and id
        digest), stored and written to the data dir like the automatic ones: keep it, and later check any copy of
        the database against it (``preflight audit verify --checkpoint FILE``)."""
        db.sealer.flush()
        try:
            with db.transaction() as session:
                audit._lock(session, wait=True)
                row = db.sealer.checkpointer.make(session) or db.sealer.checkpointer.newest_row(session)
                if row is None:
                    raise Conflict("the audit chain is empty: nothing to checkpoint")
                body = checkpoint_body(row)
        except ValueError as exc:
            raise Conflict(str(exc)) from None
        db.sealer.checkpointer.publish(row)
        return body

    @app.get("/v1/audit/checkpoints/latest", operation_id="latestAuditCheckpoint", tags=["audit"])
    def latest_checkpoint(p: Annotated[token_service.Principal, Depends(require(*READERS_AND_AGENTS))],
                          session: SessionDep):
        """The newest signed checkpoint (any token but an enroller's: agents and auditors keep copies, so that a later cut of the
        chain shows against them)."""
        row = db.sealer.checkpointer.newest_row(session)
        if row is None:
            raise NotFound("no audit checkpoint yet", field="checkpoint")
        return checkpoint_body(row)

    @app.get("/v1/calibration", operation_id="calibration", tags=["audit"])
    def calibration_summary(session: SessionDep, p: Reader, model: str | None = None, gpu: str | None = None,
                            limit: Annotated[int, Query(ge=1, le=1000)] = 100):
        """Predicted vs printed KV cache tokens over the fleet (agents send vLLM's start-up figures)."""
        return calibration.summary(session, model=model, gpu=gpu, limit=limit)

    # -- tokens ------------------------------------------------------------------------------------------------
    @app.post("/v1/tokens", status_code=201, operation_id="createToken", tags=["tokens"])
    def create_token(body: TokenIn, session: SessionDep, p: Admin):
        """Create an admin, deployer or auditor token; the secret is in the response once."""
        secret, row = token_service.create(session, role=body.role, label=body.label)
        audit.append(session, actor=p.name, kind="token.created", subject=f"token:{row.id}",
                     payload={"id": row.id, "role": row.role, "label": row.label})
        return {**token_service.token_dict(row), "token": secret}

    @app.get("/v1/tokens", operation_id="listTokens", tags=["tokens"])
    def list_tokens(session: SessionDep, p: Admin, limit: Annotated[int, Query(ge=1, le=500)] = 100,
                    after: Annotated[int | None, Query(ge=0, le=2**62)] = None):
        """Bearer tokens (never their secrets) by id; ``next`` is the cursor (pass it as ``after``)."""
        rows = token_service.list_tokens(session, limit=limit, after=after)
        return {"items": [token_service.token_dict(t) for t in rows],
                "next": rows[-1].id if len(rows) == limit else None}

    @app.post("/v1/tokens/{token_id}/revoke", operation_id="revokeToken", tags=["tokens"])
    def revoke_token(token_id: Annotated[int, Path(ge=1, le=2**62)], session: SessionDep, p: Admin):
        """Revoke a token (409 for the last active admin token unless PREFLIGHT_ADMIN_TOKEN is set)."""
        # the env admin token (PREFLIGHT_ADMIN_TOKEN) keeps the service administrable; without it, the last active
        # admin token in the database cannot be revoked (409)
        row = token_service.revoke(session, token_id, keep_an_admin=not settings.admin_token)
        after_commit(session, principal_cache.clear)
        audit.append(session, actor=p.name, kind="token.revoked", subject=f"token:{row.id}", node=row.node_name,
                     payload={"id": row.id, "role": row.role})
        return token_service.token_dict(row)

    @app.post("/v1/tokens/{token_id}/rotate", operation_id="rotateToken", tags=["tokens"])
    def rotate_token(token_id: Annotated[int, Path(ge=1, le=2**62)], session: SessionDep, p: Admin):
        """Revoke a token and issue its replacement (same role, a new id; the secret shown once)."""
        secret, row = token_service.rotate(session, token_id)
        after_commit(session, principal_cache.clear)
        audit.append(session, actor=p.name, kind="token.rotated", subject=f"token:{token_id}", node=row.node_name,
                     payload={"revoked": token_id, "id": row.id, "role": row.role})
        return {**token_service.token_dict(row), "token": secret}

    openapi_doc.install(app)
    docs.install(app)  # Swagger UI from a local package (api/docs.py)
    ui.install(app, authenticate=lambda secret: cached_principal(secret) or lookup_principal(secret))  # /ui/
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(CachedPlanFetch, answer=cached_answer)  # inside Observability: logged and counted alike
    app.add_middleware(Observability)
    return app
