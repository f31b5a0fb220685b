"""Probes and the published keys."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from .base import Out


class HealthOut(Out):
    status: Literal["ok"] = Field(description="Always ``ok``: the process answers.")


class ReadyOut(Out):
    status: Literal["ready"] = Field(description="``ready``: the database answers and a signing key is loaded.")
    database: Literal["ok"] = Field(description="``ok``: the database answered.")
    signing_key: str = Field(description="The kid of the active signing key.")


class JwkOut(Out):
    """An Ed25519 public key (RFC 8037)."""

    model_config = ConfigDict(extra="allow")  # a JWK may carry more members; they are published as they are

    kty: str = Field(description="Key type: ``OKP``.")
    crv: str = Field(description="Curve: ``Ed25519``.")
    x: str = Field(description="The public key, base64url.")
    kid: str = Field(description="Key id (what a JWS header names).")
    alg: str = Field(description="Signature algorithm.")
    use: str = Field(description="``sig``.")


class JwksOut(Out):
    keys: list[JwkOut] = Field(description="The published (not retired) signing keys.")
    version: int = Field(description="The key-set version these keys are (a node pins it in its trust file).")


class KeysetsOut(Out):
    version: int = Field(description="The current key-set version.")
    keysets: list[str] = Field(
        description="Key-set statements (compact JWS, typ keyset+jwt) above ``after``, oldest first."
    )
