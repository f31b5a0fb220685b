"""The routes' shared dependencies: the database session, the caller (bearer token → principal, through the
per-process caches), role requirements and query-time parsing. Everything per app is read from ``request.app.state``
(set by ``create_app``: db, keys, settings, clock, context, epochs, writes, principals, principal_cache,
plan_cache)."""

from __future__ import annotations

import datetime as dt
import functools
import hmac
import inspect
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Header, Path, Query, Request, Response
from fastapi.routing import APIRoute
from pydantic import AfterValidator
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from ..db.session import Database
from ..domain.errors import DomainError
from ..domain.text import escape_invisible
from ..errors import Forbidden, Unauthorized
from ..services import tokens as token_service
from ..services.context import Context
from ..services.epochs import EpochCache
from ..settings import Settings
from .schemas.requests import NAME, node_name

NodeName = Annotated[
    str, Path(pattern=NAME, description="Node name (any case; no final dot)."), AfterValidator(node_name)
]
PRINCIPAL_CACHE_SECONDS = 60.0  # TTLs bound an entry's life; coherence comes from services/epochs.py
PLAN_CACHE_SECONDS = 30.0


class Route(APIRoute):
    """Every API route: its response model validates what the service built and writes back only the keys it held
    (``exclude_unset``), so an optional key the service leaves out stays out of the answer.

    A blocking endpoint still runs in the thread pool, but its answer is serialized on the event loop: FastAPI
    serializes inside the session dependency's scope, so a second thread hop there would hold the transaction (on
    SQLite, the write lock) while waiting for a thread that may itself be waiting for that lock."""

    def __init__(self, path: str, endpoint: Callable, **kwargs):
        kwargs["response_model_exclude_unset"] = True
        if not inspect.iscoroutinefunction(endpoint):
            endpoint = _in_thread(endpoint)
        super().__init__(path, endpoint, **kwargs)


def _in_thread(endpoint: Callable) -> Callable:
    @functools.wraps(endpoint)
    async def run(*args, **kwargs):
        return await run_in_threadpool(endpoint, *args, **kwargs)

    return run


# -- query parameters -------------------------------------------------------------------------------------------------
# id(route) → (the route, its query parameter names): the route is kept, so its id is never reused for another
_DECLARED: dict[int, tuple[object, tuple[str, ...]]] = {}


def _query_names(dependant) -> set[str]:
    """The query parameters a route declares, its dependencies' included."""
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


async def known_query(request: Request) -> None:  # async: no thread hop on the agent's hot path
    """On every API route: a query parameter the operation does not declare is a 422 naming it — a misspelt filter
    (``?nod=gpu-01``) would otherwise list everything, and a misspelt switch (``?dryrun=true``) act for real."""
    if not request.query_params:
        return
    route = request.scope.get("route")
    if route is None or not hasattr(route, "dependant"):
        return
    entry = _DECLARED.get(id(route))
    if entry is None or entry[0] is not route:
        entry = _DECLARED[id(route)] = (route, tuple(sorted(_query_names(route.dependant))))
    declared = entry[1]
    unknown = sorted(set(request.query_params) - set(declared))
    if unknown:
        takes = f"this operation takes: {', '.join(declared)}" if declared else "this operation takes none"
        name = escape_invisible(unknown[0][:64])  # echoed bounded, and as text a person can read
        raise DomainError(
            f"query.{name}" if name else "query", f"unknown query parameter {name!r} ({takes})", rule="unknown_query"
        )


# -- the database session ---------------------------------------------------------------------------------------------
def session_dep(request: Request):
    with request.app.state.db.transaction() as s:
        yield s


# scope="function": the transaction commits when the route returns, before the response is sent (FastAPI's default
# for a yield dependency would commit after it, so a client could act on an acknowledgement not yet durable)
SessionDep = Annotated[Session, Depends(session_dep, scope="function")]


# -- the services' context: settings, signing keys, clock ------------------------------------------------------------
async def context_dep(request: Request) -> Context:  # async: no thread hop
    return request.app.state.context


ContextDep = Annotated[Context, Depends(context_dep)]


# -- the caller -------------------------------------------------------------------------------------------------------
def bearer_secret(authorization: str | None, copies: int = 1) -> str:
    """The token of ``Authorization: Bearer <token>``. Raises Unauthorized when it is missing, not a bearer
    token, or sent more than once (``copies``: how many Authorization fields the request carried)."""
    if copies > 1:
        raise Unauthorized("several Authorization headers: send exactly one")
    if not authorization or not authorization.lower().startswith("bearer "):
        raise Unauthorized("missing bearer token: send Authorization: Bearer <token>")
    return authorization.split(" ", 1)[1].strip()


class Principals:
    """Bearer secrets to principals, one per app (``app.state.principals``): the admin token, then the per-process
    cache of look-ups (``cache``, an EpochCache on the ``tokens`` epoch: a fleet booting at once fetches and
    reports with the same token; a token change made in any process reaches it within epochs.POLL_SECONDS), then
    the database."""

    def __init__(self, settings: Settings, db: Database, cache: EpochCache):
        self.settings, self.db, self.cache = settings, db, cache

    def cached(self, secret: str) -> token_service.Principal | None:
        """The admin token, or a cached look-up still fresh; None when the database must be asked."""
        admin = self.settings.admin_token
        if admin and hmac.compare_digest(secret.encode(), admin.encode()):
            return token_service.Principal(role="admin", name="admin")
        return self.cache.get(token_service.hash_token(secret))

    def lookup(self, secret: str) -> token_service.Principal:
        """Look the token up in the database and cache it. Raises Unauthorized."""
        tag = self.cache.tag()
        with self.db.transaction() as session:
            p = token_service.authenticate(session, secret)
        if p is None:
            raise Unauthorized("unknown or revoked token")
        self.cache.put(token_service.hash_token(secret), p, tag)
        return p

    def authenticate(self, secret: str) -> token_service.Principal:
        """Cached, else looked up (blocking). Raises Unauthorized."""
        return self.cached(secret) or self.lookup(secret)


async def principal_dep(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> token_service.Principal:
    """The caller, from ``Authorization: Bearer``. Async (no thread hop) when the look-up is cached; a miss runs
    one short transaction in the thread pool, so a long-poll holds no database connection."""
    secret = bearer_secret(authorization, len(request.headers.getlist("authorization")))
    principals: Principals = request.app.state.principals
    p = principals.cached(secret)
    return p if p is not None else await run_in_threadpool(principals.lookup, secret)


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


async def for_node_facts(name: NodeName, p: PrincipalDep) -> token_service.Principal:
    """An enroller or admin may create a node or update any node's hardware facts; an agent only its
    own node's (after inventory drift)."""
    if p.role in ("admin", "enroller"):
        return p
    return authorize_node(name, p)


Admin = Annotated[token_service.Principal, Depends(require("admin"))]
Deployer = Annotated[token_service.Principal, Depends(require("admin", "deployer"))]
Reader = Annotated[token_service.Principal, Depends(require("admin", "deployer", "auditor"))]
Auditor = Annotated[token_service.Principal, Depends(require("admin", "auditor"))]
NodeAgent = Annotated[token_service.Principal, Depends(for_node)]
NodeFactsWriter = Annotated[token_service.Principal, Depends(for_node_facts)]
READERS_AND_AGENTS = ("admin", "deployer", "auditor", "agent")  # every role but enroller
ReaderOrAgent = Annotated[token_service.Principal, Depends(require(*READERS_AND_AGENTS))]


# -- times in queries -------------------------------------------------------------------------------------------------
ISO_TIME = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?(Z|[+-]\d{2}:\d{2})?$"
TimeQuery = Annotated[str | None, Query(pattern=ISO_TIME, description="ISO 8601 time (UTC unless an offset is given)")]


def parse_time(field: str, value: str | None) -> dt.datetime | None:
    if value is None:
        return None
    try:
        t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise DomainError(field, f"{field} {value!r} is not an ISO 8601 time") from None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


# -- answers ----------------------------------------------------------------------------------------------------------
def replayable(response: Response, status: int, out: dict, replayed: bool) -> dict:
    """An ``Idempotency-Key`` route's answer (services/idempotency.py ``run``): ``out`` with the status it was first
    answered with, and ``Idempotent-Replayed: true`` on a replay."""
    response.status_code = status
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return out
