"""Bearer tokens."""

from __future__ import annotations

from pydantic import Field

from .base import Out


class TokenOut(Out):
    id: int = Field(description="Token id.")
    role: str = Field(description="admin, deployer, auditor, enroller or agent.")
    node: str | None = Field(description="The node an agent token speaks for (null for other roles).")
    label: str | None = Field(description="A name for people.")
    created_at: str | None = Field(description="When it was created (ISO 8601).")
    revoked_at: str | None = Field(description="When it was revoked (ISO 8601); null while live.")


class TokenCreatedOut(TokenOut):
    token: str = Field(description="The secret: shown once, never stored (only its hash is).")


class TokenListOut(Out):
    items: list[TokenOut] = Field(description="Tokens by id (never their secrets).")
    next: int | None = Field(description="The cursor of the next page (pass it as ``after``); null on the last page.")
