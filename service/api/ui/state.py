"""What every page reads from its app: set once by ``install`` on ``app.state.ui``, reached by the routes and
dependencies through the request (one module-level router serves any number of apps)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import jinja2
from fastapi import Depends, Request

from ...db.session import Database
from ...services.tokens import Principal
from ...settings import Settings
from .sessions import Sessions


@dataclass(frozen=True)
class PageState:
    env: jinja2.Environment  # the templates, autoescaped
    sessions: Sessions  # session cookies and CSRF tokens
    authenticate: Callable[[str], Principal]  # a bearer secret to its principal (raises Unauthorized), as the API's
    db: Database
    settings: Settings


def state_of(request: Request) -> PageState:
    return request.app.state.ui


async def page_state(request: Request) -> PageState:  # async: no thread hop
    return state_of(request)


UiState = Annotated[PageState, Depends(page_state)]
