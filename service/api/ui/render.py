"""Rendering the pages: the Jinja2 environment (autoescaped), the security headers every page carries, and the
route class that shows what a page cannot show as the error page (HTML with its status, never the API's
problem+json and never a 500) or sends a caller who is not signed in to the sign-in form."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from importlib import resources
from typing import Any
from urllib.parse import urlencode

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute

from ...domain.errors import DomainError
from ...domain.text import escape_invisible
from ...errors import ApiError
from .present import ago, pretty_json, short_time, thousands
from .sessions import safe_next
from .state import state_of

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
NO_VIEWER = {"principal": None, "csrf": "", "active": "", "can_audit": False, "can_deploy": False}


class PageError(Exception):
    """A page that cannot be shown as asked: rendered as the error page with this status (never a 500)."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


class SignInRequired(Exception):
    """No bearer header and no live session: the page answers with a redirect to the sign-in form."""


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resources.files("service.api") / "templates")), autoescape=True
    )  # every value escaped (XSS), .html or not
    env.filters.update(
        short_time=short_time,
        ago=ago,
        thousands=thousands,
        pretty_json=pretty_json,
        visible=lambda v: escape_invisible(str(v)),
    )
    env.globals["urlencode"] = urlencode
    return env


def page(request: Request, template: str, http_status: int = 200, **context) -> HTMLResponse:
    body = state_of(request).env.get_template(template).render(request=request, **context)
    return HTMLResponse(body, status_code=http_status, headers=PAGE_HEADERS)


def error_page(request: Request, status: int, message: str, field: str | None) -> HTMLResponse:
    """The error page, with the navigation of the caller when the page's dependencies had signed them in."""
    context = getattr(request.state, "page_context", None) or NO_VIEWER
    return page(request, "error.html", http_status=status, message=message, field=field, **context)


def login_redirect(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse("/ui/login?" + urlencode({"next": safe_next(target)}), status_code=303)


def bounded(field: str, value: str | None, limit: int = 256) -> str | None:
    if value is None or value == "":
        return None
    if len(value) > limit or not value.isprintable():
        raise PageError(422, f"{field}: at most {limit} printable characters", field)
    return value


class PageRoute(APIRoute):
    """A page's route: sign-in and every PageError / ApiError / DomainError raised by its dependencies or its body
    become a redirect or the error page here, before the app's problem+json handlers could see them."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def page_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except SignInRequired:
                return login_redirect(request)
            except PageError as exc:
                return error_page(request, exc.status, exc.message, exc.field)
            except ApiError as exc:
                return error_page(request, exc.status, exc.detail, exc.extra.get("field"))
            except DomainError as exc:
                return error_page(request, 422, exc.message, exc.field)

        return page_handler
