"""The operators' view at ``/ui/``: server-rendered pages (Jinja2, autoescaped; a few lines of plain JavaScript for the
copy button), every asset served by the service itself.

- **Fleet** (fleet.py): one row per node — hardware, agent last seen, desired vs running plan, drift, status, model,
  predicted vs measured KV tokens; filters by status and model.
- **Plan** and **rollout** (detail.py): the ``vllm serve`` command, findings with remedies, recommendations, the
  per-GPU memory bar, its nodes and their reports; a rollout's waves and, for auditors, its steps.
- **Audit** (audit.py): the timeline with filters, the chain's verify status and the newest checkpoint.
- **Try a launch** (dry_run.py): a dry run of ``POST /v1/plans`` (nothing stored).

Sign-in and sign-out (signin.py) set and clear a signed session cookie (sessions.py); who may see a page is a
FastAPI dependency (auth.py: the bearer header or the session cookie, and the page's roles); rendering, the
security headers and the error page are in render.py, the pure presentation helpers in present.py. What the pages
share per app (templates, session signer, database, settings) is one ``PageState`` on ``app.state.ui``."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources

from fastapi import APIRouter, FastAPI
from fastapi.staticfiles import StaticFiles

from ...services.tokens import Principal
from . import audit, detail, dry_run, fleet, signin
from .render import PageError, environment
from .sessions import SESSION_COOKIE, Sessions, safe_next
from .state import PageState

__all__ = ["PageError", "SESSION_COOKIE", "install", "router", "safe_next"]

router = APIRouter()
for _pages in (signin.router, fleet.router, detail.router, audit.router, dry_run.router):
    router.include_router(_pages)


def install(app: FastAPI, *, authenticate: Callable[[str], Principal]) -> None:
    """Mount the pages under ``/ui/`` (``/`` redirects there) and their static files under ``/ui/static/``.
    ``authenticate`` maps a bearer secret to its principal (raises Unauthorized), as the API does."""
    app.state.ui = PageState(
        env=environment(),
        sessions=Sessions(app.state.keys),
        authenticate=authenticate,
        db=app.state.db,
        settings=app.state.settings,
    )
    app.mount("/ui/static", StaticFiles(directory=str(resources.files("service.api") / "static")), name="ui-static")
    app.include_router(router, include_in_schema=False)
