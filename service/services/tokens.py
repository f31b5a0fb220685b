"""Bearer tokens: random 256-bit secrets, stored only as SHA-256 hashes, each with a role."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..db.models import Token, iso, utcnow
from ..errors import Conflict, Forbidden
from . import epochs

ROLES = ("admin", "deployer", "agent", "auditor", "enroller")  # enroller: creates nodes, updates their hardware facts


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_secret() -> str:
    """``pf_`` and 43 characters of the URL-safe base64 alphabet: the shape an agent accepts from its token file
    (service/agent/files.py ``TOKEN_RE``; tests/agent/test_files.py keeps the two together)."""
    return "pf_" + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Principal:
    """Who is calling: role, and for agents the one node they speak for."""

    role: str
    name: str
    node: str | None = None
    token_id: int | None = None


def authorize_node(node: str, p: Principal) -> Principal:
    """An admin, or the node's own agent, may act for a node. Raises Forbidden otherwise."""
    if p.role == "admin" or (p.role == "agent" and p.node == node):
        return p
    raise Forbidden(f"this token may not act for node {node!r}")


def create(session: Session, *, role: str, node: str | None = None, label: str | None = None) -> tuple[str, Token]:
    """Create a token; returns the secret (shown once) and its row."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}")
    secret = new_secret()
    row = Token(token_hash=hash_token(secret), role=role, node_name=node, label=label)
    session.add(row)
    session.flush()
    return secret, row


def authenticate(session: Session, secret: str) -> Principal | None:
    """The principal of a live (unrevoked) token, or None."""
    return authenticate_many(session, [secret])[secret]


def authenticate_many(session: Session, secrets_: list[str]) -> dict[str, Principal | None]:
    """``authenticate`` for several secrets in one query (the agents' batched first fetches)."""
    by_hash = {hash_token(s): s for s in secrets_}
    out: dict[str, Principal | None] = dict.fromkeys(secrets_)
    for row in session.execute(
        select(Token).where(Token.token_hash.in_(list(by_hash)), Token.revoked_at.is_(None))
    ).scalars():
        name = f"{row.role}:{row.node_name}" if row.node_name else f"{row.role}:token-{row.id}"
        out[by_hash[row.token_hash]] = Principal(role=row.role, name=name, node=row.node_name, token_id=row.id)
    return out


def revoke_node_tokens(session: Session, node: str) -> int:
    rows = session.execute(select(Token).where(Token.node_name == node, Token.revoked_at.is_(None))).scalars().all()
    for r in rows:
        r.revoked_at = utcnow()
    if rows:
        epochs.bump(session, "tokens", node)  # other processes' principal caches drop these tokens
    return len(rows)


def token_dict(row: Token) -> dict:
    return {
        "id": row.id,
        "role": row.role,
        "node": row.node_name,
        "label": row.label,
        "created_at": iso(row.created_at),
        "revoked_at": iso(row.revoked_at),
    }


def get(session: Session, token_id: int, *, for_update: bool = False) -> Token:
    from ..errors import NotFound

    row = session.get(Token, token_id, with_for_update=for_update or None)
    if row is None:
        raise NotFound(f"token {token_id} does not exist", field="token_id")
    return row


def list_tokens(session: Session, *, limit: int, after: int | None) -> list[Token]:
    q = select(Token).order_by(Token.id).limit(limit)
    if after:
        q = q.where(Token.id > after)
    return list(session.execute(q).scalars())


def revoke(session: Session, token_id: int, *, keep_an_admin: bool = True) -> Token:
    """Revoke a token (idempotent). The last active admin token is never revoked (Conflict) while
    ``keep_an_admin`` — the service would have no administrator left (pass False when another admin exists outside
    the database, e.g. PREFLIGHT_ADMIN_TOKEN). Active admin rows are read locked, so two concurrent revocations of
    the last two admins cannot both succeed."""
    row = get(session, token_id)
    if row.revoked_at is None:
        if row.role == "admin" and keep_an_admin:
            admins = (
                session.execute(
                    select(Token.id)
                    .where(Token.role == "admin", Token.revoked_at.is_(None))
                    .order_by(Token.id)
                    .with_for_update()
                )
                .scalars()
                .all()
            )
            if admins == [row.id]:
                raise Conflict(
                    "this is the last active admin token: create another admin token before revoking it "
                    "(the service would have no administrator left)",
                    field="token_id",
                )
        row.revoked_at = utcnow()
        epochs.bump(session, "tokens", str(row.id))
    return row


def rotate(session: Session, token_id: int) -> tuple[str, Token]:
    """Revoke a live token and issue a new one with the same role, node and label. A revoked token cannot be
    rotated (Conflict): that would bring a withdrawn credential back to life."""
    old = get(session, token_id, for_update=True)  # concurrent rotations of one token serialize: one succeeds
    if old.revoked_at is not None:
        raise Conflict(f"token {token_id} is revoked: create a new token instead", field="token_id")
    secret, new = create(session, role=old.role, node=old.node_name, label=old.label)
    revoke(session, token_id, keep_an_admin=False)  # its replacement is an admin already
    return secret, new


def is_live(session: Session, secret: str) -> bool:
    return authenticate(session, secret) is not None
