"""The FastAPI application: settings, database and keys, the lifespan, one problem+json error contract and the
middleware; the routes live one router per domain in routers/ (their shared dependencies in deps.py)."""

import contextlib
import logging
import re
import threading
import types
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, IntegrityError, InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__, audit
from ..clock import SYSTEM, Clock
from ..db.session import THREADS, Database
from ..domain.errors import DomainError
from ..errors import ApiError
from ..services import rollouts as rollout_service
from ..services.agent_writes import AgentWrites
from ..services.context import Context
from ..services.epochs import EpochCache, EpochWatcher
from ..settings import Settings
from ..signing import KeyStore
from . import docs, openapi_doc, ui
from .deps import PLAN_CACHE_SECONDS, PRINCIPAL_CACHE_SECONDS, Principals, known_query
from .observability import Observability
from .routers import agent, manifests, nodes, ops, plans, rollouts, tokens, tuning
from .routers import audit as audit_routes
from .routers import keys as keys_routes

log = logging.getLogger("preflight")
PROBLEM = "application/problem+json"


def error_field(e: dict[str, Any]) -> str:
    """The field a validation error names: its location without the ``body`` prefix, extended by the path inside
    the value when a JSON check (domain/jsoncheck.py) or a nested validator said which part was wrong."""
    if e.get("type") == "json_invalid":
        return "body"
    loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
    inner = getattr((e.get("ctx") or {}).get("error"), "path", "")
    return ".".join(p for p in (loc, inner) if p) or "body"


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
            return problem_response(
                413,
                {
                    "type": "https://preflight.dev/problems/too-large",
                    "title": "Payload too large",
                    "status": 413,
                    "detail": f"request body exceeds {self.limit} bytes",
                },
            )

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
    """ASGI fast path for an agent's ``GET /v1/nodes/{name}/plan`` (no query string, so no long-poll): ``answer``
    builds the very response the route would — from the per-process caches (token and assignment cached under the
    current epochs, nothing to record), or through the agents' group commit (a delivery to record: a booting fleet's
    first fetches) — and it is sent without FastAPI's routing and parameter handling. Anything else (any error, a
    held worker, a node without a plan) goes to the route."""

    PATH = re.compile(r"/v1/nodes/([A-Za-z0-9][A-Za-z0-9._-]{0,127})/plan")  # names as NodeIn allows
    ROUTE = types.SimpleNamespace(path="/v1/nodes/{name}/plan")  # the route label Observability records

    def __init__(self, app, answer: Callable[[str, str | None, str | None, str | None], Awaitable[Response | None]]):
        self.app, self.answer = app, answer

    async def __call__(self, scope, receive, send):
        if (
            scope["type"] == "http"
            and scope["method"] == "GET"
            and not scope.get("query_string")
            and not scope.get("root_path")
        ):
            m = self.PATH.fullmatch(scope["path"])
            if m is not None and not m.group(1).endswith("."):  # a final dot is the route's 422
                auth: list[str] = []
                inm: list[str] = []
                nonce: list[str] = []
                for k, v in scope.get("headers") or ():
                    if k == b"authorization":
                        auth.append(v.decode("latin-1"))
                    elif k == b"if-none-match":
                        inm.append(v.decode("latin-1"))
                    elif k == b"x-plan-nonce":
                        nonce.append(v.decode("latin-1"))
                # exactly one Authorization field, or the route refuses it; repeated If-None-Match fields form one
                # list; more than one X-Plan-Nonce is the route's to judge
                response = (
                    await self.answer(m.group(1).lower(), auth[0], ", ".join(inm), nonce[0] if nonce else None)
                    if len(auth) == 1 and len(nonce) <= 1
                    else None
                )
                if response is not None:
                    scope["route"] = self.ROUTE
                    return await response(scope, receive, send)
        return await self.app(scope, receive, send)


class AgentReports:
    """ASGI fast path for an agent's ``POST /v1/nodes/{name}/reports`` (no query string, one ``Content-Type:
    application/json`` field, one Authorization field): ``answer`` takes the body and gives the route's 201 when the
    token is cached and the report valid and stored, else None and the route gets the request, body replayed.
    Installed inside BodyLimit, which bounds the body read here."""

    PATH = re.compile(r"/v1/nodes/([A-Za-z0-9][A-Za-z0-9._-]{0,127})/reports")
    ROUTE = types.SimpleNamespace(path="/v1/nodes/{name}/reports")

    def __init__(self, app, answer: Callable[[str, str | None, bytes], Awaitable[Response | None]]):
        self.app, self.answer = app, answer

    async def __call__(self, scope, receive, send):
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope.get("query_string")
            or scope.get("root_path")
            or (m := self.PATH.fullmatch(scope["path"])) is None
            or m.group(1).endswith(".")  # a final dot is the route's 422
        ):
            return await self.app(scope, receive, send)
        auth: list[str] = []
        types: list[bytes] = []
        for k, v in scope.get("headers") or ():
            if k == b"authorization":
                auth.append(v.decode("latin-1"))
            elif k == b"content-type":
                types.append(v)
        # exactly one Content-Type field: the route reads the first of several, which may not be JSON at all
        if len(auth) != 1 or types != [b"application/json"]:
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return  # the client went away
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        response = await self.answer(m.group(1).lower(), auth[0], body)
        if response is not None:
            scope["route"] = self.ROUTE
            return await response(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


def install_error_handlers(app: FastAPI) -> None:
    """One error contract (RFC 9457 problem+json) for every error: the service's, the domain's, FastAPI's
    validation, Starlette's HTTP errors, the database's (never its own text) and anything unexpected (logged)."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError):
        retry = getattr(exc, "retry_after", None)
        return problem_response(
            exc.status, exc.problem(), headers={"Retry-After": str(retry)} if retry is not None else None
        )

    @app.exception_handler(DomainError)
    async def _domain_error(_: Request, exc: DomainError):
        return problem_response(
            422,
            {
                "type": "https://preflight.dev/problems/invalid",
                "title": "Invalid request",
                "status": 422,
                "detail": exc.message,
                "errors": [exc.as_dict()],
            },
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        errors = [{"field": error_field(e), "rule": e.get("type"), "message": e.get("msg")} for e in exc.errors()]
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
        return problem_response(
            422,
            {
                "type": "https://preflight.dev/problems/invalid",
                "title": "Invalid request",
                "status": 422,
                "detail": detail,
                "errors": errors,
            },
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        body = {"type": "about:blank", "title": str(exc.detail), "status": exc.status_code, "detail": str(exc.detail)}
        if exc.status_code == 400:
            body["errors"] = [{"field": "body", "rule": "unparseable", "message": str(exc.detail)}]
        return problem_response(exc.status_code, body, headers=getattr(exc, "headers", None))

    _install_database_handlers(app)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unhandled error", extra={"request_id": _request_id(request), "path": request.url.path})
        return problem_response(
            500,
            {
                "type": "https://preflight.dev/problems/internal",
                "title": "Internal error",
                "status": 500,
                "detail": "an unexpected error; it has been logged",
            },
        )


def _request_id(request: Request) -> str | None:
    return request.scope.get("state", {}).get("request_id")


def _log_database_error(request: Request, level: int, what: str, detail: str) -> None:
    """The database's own text goes to the log with the request id and path, never into the response."""
    log.log(level, what, detail, extra={"request_id": _request_id(request), "path": request.url.path})


def _install_database_handlers(app: FastAPI) -> None:
    """The database's errors as problems: a refused value (422), a conflict (409), the database down (503); its own
    text goes to the log with the request id, never into the response."""

    @app.exception_handler(DataError)
    async def _data_error(request: Request, exc: Exception):
        _log_database_error(
            request, logging.WARNING, "value refused by the database: %s", str(getattr(exc, "orig", exc))[:300]
        )
        return problem_response(
            422,
            {
                "type": "https://preflight.dev/problems/invalid",
                "title": "Invalid request",
                "status": 422,
                "detail": "a value cannot be stored (out of range or not representable)",
                "errors": [{"field": "body", "rule": "unstorable", "message": "a value cannot be stored"}],
            },
        )

    @app.exception_handler(IntegrityError)
    async def _conflict(request: Request, exc: Exception):
        _log_database_error(request, logging.WARNING, "integrity conflict: %s", str(getattr(exc, "orig", exc))[:300])
        return problem_response(
            409,
            {
                "type": "https://preflight.dev/problems/conflict",
                "title": "Conflict",
                "status": 409,
                "detail": "the change conflicts with one made at the same time; read the current state and retry",
            },
        )

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    async def _db_down(request: Request, exc: Exception):
        _log_database_error(request, logging.ERROR, "database error: %s", exc.__class__.__name__)
        return problem_response(
            503,
            {
                "type": "https://preflight.dev/problems/unavailable",
                "title": "Service unavailable",
                "status": 503,
                "detail": "the database is unreachable; retry later",
            },
            headers={"Retry-After": "5"},
        )


class Workers:
    """The background work of one app: the agents' group-committed writes (services/agent_writes.py), the epoch
    watcher that keeps the agents' caches coherent across processes (services/epochs.py) and the rollout scheduler
    (services/rollouts/); ``lifespan`` starts and stops them with the audit sealer."""

    def __init__(self, db: Database, ctx: Context):
        self.db = db
        self.writes = AgentWrites(db, clock=ctx.clock)
        self.watcher = EpochWatcher(db, clock=ctx.clock)
        self.scheduler = rollout_service.RolloutScheduler(db, ctx, ctx.settings.rollout_tick_seconds)

    @contextlib.asynccontextmanager
    async def lifespan(self, _app):
        import anyio.to_thread

        anyio.to_thread.current_default_thread_limiter().total_tokens = THREADS  # = the database pool's size
        self.db.sealer.start()  # audit events are sealed into the chain by a background thread per process
        self.watcher.start()  # until it has polled once, the agents' caches stay unused
        self.scheduler.start()  # steps the staged rollouts
        try:
            yield
        finally:
            self.scheduler.stop()
            self.watcher.stop()
            self.writes.stop()  # answer what is queued before the last seal
            self.db.sealer.stop()


def _seal_with_keys(db: Database, keys: KeyStore, settings: Settings, clock: Clock) -> None:
    """Every audit event this process writes carries a MAC the sealer checks; the sealer signs checkpoints."""
    if db.audit_keys is None:
        db.audit_keys = audit.AuditKeys(keys)
    db.sealer.checkpointer = audit.Checkpointer(
        keys,
        settings.issuer,
        settings.checkpoint_file,
        every_events=settings.audit_checkpoint_events,
        every_seconds=settings.audit_checkpoint_seconds,
        clock=clock,
    )


def _install_caches(app: FastAPI, ctx: Context, workers: Workers) -> None:
    """Per-process caches for the agents' hot path, coherent across processes (services/epochs.py): a token's
    principal (a fleet booting at once fetches and reports with the same token) and a node's current assignment
    (repeated fetches are answered from memory; a fetch that must be recorded — the first of an assignment, or a
    minute after the last record — always goes to the database). A plan or token change made in any process reaches
    every cache within epochs.POLL_SECONDS; in the process that made it, at once."""
    state = app.state
    state.principal_cache = EpochCache(workers.watcher, "tokens", PRINCIPAL_CACHE_SECONDS)
    state.plan_cache = EpochCache(workers.watcher, "plans", PLAN_CACHE_SECONDS)
    state.principals = Principals(ctx.settings, state.db, state.principal_cache)
    state.plan_server = agent.PlanServer(ctx.settings, ctx.keys, state.principals, state.plan_cache, ctx.clock)
    # waves signed or restored in this process: its plan cache drops at once
    workers.scheduler.on_change = state.plan_cache.clear
    state.audit_verifying = threading.Lock()  # one whole-chain verification per process at a time
    state.verify_audit = lambda: audit_routes.verify_chain_now(state)  # the API's and the UI's


def _install_routes(app: FastAPI) -> None:
    """One router per domain (service/api/routers/), in this order: the agent's first, so the fleet's hot path is
    matched before any other route."""
    for router in (
        agent.router,
        ops.router,
        keys_routes.router,
        nodes.router,
        manifests.router,
        plans.router,
        rollouts.router,
        audit_routes.router,
        tokens.router,
        tuning.router,
    ):
        # probes, metrics and the published key set answer whatever a load balancer or cache-buster appends
        open_query = router in (ops.router, keys_routes.router)
        app.include_router(router, dependencies=[] if open_query else [Depends(known_query)])


def create_app(
    settings: Settings, *, db: Database | None = None, keys: KeyStore | None = None, clock: Clock = SYSTEM
) -> FastAPI:
    """The app: ``clock`` is what its services read the time from (a test passes a ManualClock)."""
    db = db or Database(settings.resolved_database_url)
    keys = keys or KeyStore(settings.key_dir, create=settings.env != "production")
    _seal_with_keys(db, keys, settings, clock)
    ctx = Context(settings, keys, clock)
    workers = Workers(db, ctx)
    app = FastAPI(
        title="Preflight",
        version=__version__,
        lifespan=workers.lifespan,
        docs_url=None,
        redoc_url=None,
        description="Validates, signs and audits vLLM launch configurations before any GPU is touched.",
    )
    state = app.state
    state.db, state.keys, state.settings, state.clock, state.context = db, keys, settings, clock, ctx
    state.epochs, state.rollouts, state.writes = workers.watcher, workers.scheduler, workers.writes
    install_error_handlers(app)
    _install_caches(app, ctx, workers)
    _install_routes(app)
    openapi_doc.install(app)
    docs.install(app)  # Swagger UI from a local package (api/docs.py)
    ui.install(app, authenticate=state.principals.authenticate)  # /ui/
    server, writes = state.plan_server, workers.writes
    app.add_middleware(AgentReports, answer=lambda n, a, b: server.report_answer(n, a, b, writes))
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)  # outside AgentReports: it bounds what that reads
    # inside Observability: logged and counted alike
    app.add_middleware(CachedPlanFetch, answer=lambda n, a, i, nonce: server.answer(n, a, i, nonce, writes))
    app.add_middleware(Observability)
    return app
