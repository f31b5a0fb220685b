"""Who is looking at a page, as FastAPI dependencies: the ``Authorization: Bearer`` header first (then no cookie,
and no CSRF token is needed: a browser does not send the header on its own), else the session cookie, whose token
is looked up on every request (a revoked token ends its sessions at once). Not signed in: a redirect to the
sign-in form; a bad bearer header: 401; an agent token or a role the page does not admit: 403. Roles see what the
API shows them: env values only for admin and deployer, the audit for admin and auditor, the dry run for admin
and deployer."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request

from ...db.models import Token
from ...errors import ApiError
from ...services.tokens import Principal, hash_token
from .render import PageError, SignInRequired
from .sessions import SESSION_COOKIE
from .state import PageState, UiState

UI_ROLES = ("admin", "deployer", "auditor")  # agent tokens speak for one node: they do not sign in here
SECRETS = ("admin", "deployer")  # who sees env values (as the API)
AUDITORS = ("admin", "auditor")
DEPLOYERS = ("admin", "deployer")


@dataclass(frozen=True)
class Viewer:
    """A signed-in caller of a page: the principal, the session cookie (None when signed in by bearer header), the
    CSRF token of that session for the page's forms, and the page's entry in the navigation."""

    principal: Principal
    cookie: str | None
    csrf: str
    active: str

    @property
    def context(self) -> dict[str, Any]:
        """What every page's template reads about its viewer (base.html's navigation and sign-out form)."""
        role = self.principal.role
        return {
            "principal": self.principal,
            "csrf": self.csrf,
            "active": self.active,
            "can_audit": role in AUDITORS,
            "can_deploy": role in DEPLOYERS,
        }


def from_cookie(state: PageState, data: dict) -> Principal | None:
    """The principal of a verified session cookie's payload, or None when its token is gone, revoked or changed."""
    if data["t"] == 0:  # the env admin token (PREFLIGHT_ADMIN_TOKEN) has no row
        admin = state.settings.admin_token
        if admin and hmac.compare_digest(hash_token(admin)[:32], data["h"]):
            return Principal(role="admin", name="admin")
        return None
    with state.db.read() as s:
        row = s.get(Token, data["t"])
        if (
            row is None
            or row.revoked_at is not None
            or row.role not in UI_ROLES
            or not hmac.compare_digest(row.token_hash[:32], data["h"])
        ):
            return None
        return Principal(role=row.role, name=f"{row.role}:token-{row.id}", token_id=row.id)


def from_bearer(state: PageState, headers: list[str]) -> Principal:
    """The principal of the request's Authorization header(s). Raises PageError 401 or 403."""
    if len(headers) > 1 or not headers[0].lower().startswith("bearer "):
        raise PageError(401, "send exactly one Authorization: Bearer header")
    try:
        p = state.authenticate(headers[0].split(" ", 1)[1].strip())
    except ApiError as exc:
        raise PageError(401, exc.detail) from None
    if p.role not in UI_ROLES:
        raise PageError(403, "agent tokens cannot use the operators' pages")
    return p


def who(request: Request, state: PageState) -> tuple[Principal | None, str | None]:
    """(principal, session cookie) — the bearer header first (no cookie then), else the session cookie."""
    auth = request.headers.getlist("authorization")
    if auth:
        return from_bearer(state, auth), None
    cookie = request.cookies.get(SESSION_COOKIE)
    data = state.sessions.read(cookie)
    return (from_cookie(state, data), cookie) if data is not None else (None, None)


def signed_in(active: str, roles: tuple[str, ...] = UI_ROLES) -> Callable[..., Viewer]:
    """A dependency: the page's viewer, signed in with one of ``roles``; ``active`` names the page in the
    navigation."""

    def viewer(request: Request, state: UiState) -> Viewer:
        # sync: FastAPI runs it in the thread pool, as the cookie's token is read from the database
        principal, cookie = who(request, state)
        if principal is None:
            raise SignInRequired()
        v = Viewer(principal, cookie, state.sessions.csrf(cookie) if cookie else "", active)
        request.state.page_context = v.context  # from here on an error page shows the viewer's navigation
        if principal.role not in roles:
            raise PageError(403, f"role {principal.role} may not see this page (needs {' or '.join(roles)})")
        return v

    return viewer


Reader = Annotated[Viewer, Depends(signed_in("fleet"))]
Auditor = Annotated[Viewer, Depends(signed_in("audit", AUDITORS))]
Deployer = Annotated[Viewer, Depends(signed_in("try", DEPLOYERS))]


async def form_of_deployer(request: Request, viewer: Deployer, state: UiState) -> Viewer:
    """A deployer's form post: signed in by cookie, the form must carry this session's CSRF token."""
    if viewer.cookie is not None:
        csrf = (await request.form()).get("csrf")  # Starlette keeps the parsed form: the route reads it again
        if not state.sessions.csrf_ok(viewer.cookie, csrf if isinstance(csrf, str) else None):
            raise PageError(403, "csrf: the form did not come from this page (reload it and try again)", "csrf")
    return viewer


DeployerForm = Annotated[Viewer, Depends(form_of_deployer)]
