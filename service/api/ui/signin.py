"""The redirects to the fleet page, sign-in and sign-out. The sign-in form takes a token and sets the session
cookie (HttpOnly, SameSite=Strict, Path=/ui, Secure over HTTPS); it carries its own CSRF token, double-submitted
against a short-lived pre-session cookie. Sign-out with the cookie needs the session's CSRF token."""

from __future__ import annotations

import secrets as pysecrets

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse
from starlette.concurrency import run_in_threadpool

from ...errors import ApiError
from .auth import UI_ROLES
from .render import error_page, page
from .sessions import COOKIE_PATH, LOGIN_COOKIE, LOGIN_SECONDS, SESSION_COOKIE, SESSION_SECONDS, safe_next
from .state import UiState

router = APIRouter()


@router.get("/")
def root():
    return RedirectResponse("/ui/", status_code=307)


@router.get("/ui")
def ui_root():
    return RedirectResponse("/ui/", status_code=307)


def login_form(request: Request, state: UiState, status: int = 200, message: str | None = None, next_: str = "/ui/"):
    nonce = pysecrets.token_urlsafe(16)
    resp = page(
        request,
        "login.html",
        http_status=status,
        message=message,
        next=safe_next(next_),
        csrf=state.sessions.csrf("login:" + nonce),
        principal=None,
        active="login",
        can_audit=False,
        can_deploy=False,
    )
    resp.set_cookie(
        LOGIN_COOKIE,
        nonce,
        max_age=LOGIN_SECONDS,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return resp


@router.get("/ui/login")
def login_page(request: Request, state: UiState, next: str | None = None):
    return login_form(request, state, next_=next or "/ui/")


@router.post("/ui/login")
async def login(request: Request, state: UiState):
    form = await request.form()
    token, csrf, next_ = form.get("token"), form.get("csrf"), form.get("next")
    next_ = safe_next(next_ if isinstance(next_, str) else None)
    nonce = request.cookies.get(LOGIN_COOKIE)
    if not isinstance(csrf, str) or not nonce or not state.sessions.csrf_ok("login:" + nonce, csrf):
        return login_form(
            request, state, 403, "The sign-in form expired or did not come from this page: try again.", next_
        )
    if not isinstance(token, str) or not token.strip() or len(token) > 512:
        return login_form(request, state, 422, "token: paste a Preflight token (admin, deployer or auditor).", next_)
    secret = token.strip()
    try:
        p = await run_in_threadpool(state.authenticate, secret)
    except ApiError:
        return login_form(request, state, 401, "token: unknown or revoked token.", next_)
    if p.role not in UI_ROLES:
        return login_form(request, state, 403, "token: agent tokens cannot sign in here.", next_)
    resp = RedirectResponse(next_, status_code=303)
    resp.set_cookie(
        SESSION_COOKIE,
        state.sessions.issue(p, secret),
        max_age=SESSION_SECONDS,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    resp.delete_cookie(LOGIN_COOKIE, path=COOKIE_PATH)
    return resp


@router.post("/ui/logout")
async def logout(request: Request, state: UiState):
    form = await request.form()
    cookie = request.cookies.get(SESSION_COOKIE)
    csrf = form.get("csrf")
    if cookie and not state.sessions.csrf_ok(cookie, csrf if isinstance(csrf, str) else None):
        return error_page(request, 403, "csrf: the sign-out form did not come from this page", "csrf")
    resp = RedirectResponse("/ui/login", status_code=303)
    resp.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH)
    return resp
