"""Bearer tokens (admin only): create, list, revoke, rotate."""

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from ... import audit
from ...db.session import after_commit
from ...services import tokens as token_service
from ..deps import Admin, Route, SessionDep
from ..schemas import TokenCreatedOut, TokenIn, TokenListOut, TokenOut

router = APIRouter(route_class=Route)


@router.post("/v1/tokens", status_code=201, operation_id="createToken", tags=["tokens"], response_model=TokenCreatedOut)
def create_token(body: TokenIn, session: SessionDep, p: Admin):
    """Create an admin, deployer or auditor token; the secret is in the response once."""
    secret, row = token_service.create(session, role=body.role, label=body.label)
    audit.append(
        session,
        actor=p.name,
        kind="token.created",
        subject=f"token:{row.id}",
        payload={"id": row.id, "role": row.role, "label": row.label},
    )
    return {**token_service.token_dict(row), "token": secret}


@router.get("/v1/tokens", operation_id="listTokens", tags=["tokens"], response_model=TokenListOut)
def list_tokens(
    session: SessionDep,
    p: Admin,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    after: Annotated[int | None, Query(ge=0, le=2**62)] = None,
):
    """Bearer tokens (never their secrets) by id; ``next`` is the cursor (pass it as ``after``)."""
    rows = token_service.list_tokens(session, limit=limit, after=after)
    return {"items": [token_service.token_dict(t) for t in rows], "next": rows[-1].id if len(rows) == limit else None}


@router.post("/v1/tokens/{token_id}/revoke", operation_id="revokeToken", tags=["tokens"], response_model=TokenOut)
def revoke_token(request: Request, token_id: Annotated[int, Path(ge=1, le=2**62)], session: SessionDep, p: Admin):
    """Revoke a token (409 for the last active admin token unless PREFLIGHT_ADMIN_TOKEN is set)."""
    # the env admin token (PREFLIGHT_ADMIN_TOKEN) keeps the service administrable; without it, the last active
    # admin token in the database cannot be revoked (409)
    state = request.app.state
    row = token_service.revoke(session, token_id, keep_an_admin=not state.settings.admin_token)
    after_commit(session, state.principal_cache.clear)
    audit.append(
        session,
        actor=p.name,
        kind="token.revoked",
        subject=f"token:{row.id}",
        node=row.node_name,
        payload={"id": row.id, "role": row.role},
    )
    return token_service.token_dict(row)


@router.post(
    "/v1/tokens/{token_id}/rotate", operation_id="rotateToken", tags=["tokens"], response_model=TokenCreatedOut
)
def rotate_token(request: Request, token_id: Annotated[int, Path(ge=1, le=2**62)], session: SessionDep, p: Admin):
    """Revoke a token and issue its replacement (same role, a new id; the secret shown once)."""
    secret, row = token_service.rotate(session, token_id)
    after_commit(session, request.app.state.principal_cache.clear)
    audit.append(
        session,
        actor=p.name,
        kind="token.rotated",
        subject=f"token:{token_id}",
        node=row.node_name,
        payload={"revoked": token_id, "id": row.id, "role": row.role},
    )
    return {**token_service.token_dict(row), "token": secret}
