"""Offline verification of a signed plan, failing closed.

The agent pins the algorithm (Ed25519, or its legacy name EdDSA) and the key type (OKP): ``none``, HMAC and RSA/EC
headers are refused before any key is touched, so algorithm confusion (e.g. HS256 keyed with the public key) cannot
work. Then: a known ``kid`` in the JWKS, a valid signature, ``typ`` the plan media type, ``sub`` = this node,
``aud``, the time window (``nbf`` ≤ now < ``exp``, with a small leeway), and ``seq`` strictly greater than the last
sequence this node accepted (rollback protection, like TUF clients).
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from typing import Any

from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import OKPKey

from ..signing import PLAN_MEDIA_TYPE

PINNED_ALGS = ("Ed25519", "EdDSA")
LEEWAY = 60


class VerificationError(Exception):
    """The plan must not run. ``reason`` is a short machine-readable code."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class VerifiedPlan:
    claims: dict[str, Any]
    kid: str

    @property
    def argv(self) -> list[str]:
        return list(self.claims["argv"])

    @property
    def seq(self) -> int:
        return int(self.claims["seq"])


def _b64json(part: str) -> dict:
    pad = "=" * (-len(part) % 4)
    return json.loads(base64.urlsafe_b64decode(part + pad))


def verify_jws(token: str, jwks: dict, *, typ: str) -> tuple[dict[str, Any], str]:
    """Check header (pinned alg, ``typ``), ``kid`` and signature; return ``(claims, kid)``. Raises
    VerificationError."""
    if not isinstance(token, str) or token.count(".") != 2:
        raise VerificationError("malformed", "not a compact JWS")
    try:
        header = _b64json(token.split(".")[0])
    except Exception:
        raise VerificationError("malformed", "unreadable protected header") from None
    alg = header.get("alg")
    if alg not in PINNED_ALGS:
        raise VerificationError("alg_refused", f"algorithm {alg!r} is not pinned ({', '.join(PINNED_ALGS)})")
    if header.get("typ") != typ:
        raise VerificationError("typ", f"typ {header.get('typ')!r} is not {typ}")
    kid = header.get("kid")
    jwk = next((k for k in (jwks or {}).get("keys", []) if k.get("kid") == kid), None)
    if jwk is None:
        raise VerificationError("unknown_kid", f"key id {kid!r} is not in the published JWKS")
    if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519" or "d" in jwk:
        raise VerificationError("bad_key", f"key {kid!r} is not a public Ed25519 OKP key")
    try:
        key = OKPKey.import_key({k: v for k, v in jwk.items() if k in ("kty", "crv", "x", "kid")})
        obj = jws.deserialize_compact(token, key, algorithms=[alg])
    except (JoseError, ValueError) as exc:
        raise VerificationError("bad_signature", f"signature does not verify: {exc.__class__.__name__}") from None
    try:
        claims = json.loads(obj.payload)
    except ValueError:
        raise VerificationError("malformed", "payload is not JSON") from None
    if not isinstance(claims, dict):
        raise VerificationError("malformed", "payload is not a JSON object")
    return claims, kid


def _number(value) -> bool:
    """A JSON number (``true`` is not one, although Python's bool is an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def verify_plan(token: str, jwks: dict, *, node: str, audience: str, last_seq: int = 0, issuer: str | None = None,
                now: float | None = None) -> VerifiedPlan:
    """Verify a compact JWS plan for ``node``. Raises VerificationError naming the first failed check."""
    claims, kid = verify_jws(token, jwks, typ=PLAN_MEDIA_TYPE)
    t = time.time() if now is None else now
    checks = [
        (claims.get("sub") == node, "wrong_node", f"plan is for node {claims.get('sub')!r}, not {node!r}"),
        (claims.get("aud") == audience, "wrong_audience", f"aud {claims.get('aud')!r} is not {audience!r}"),
        (issuer is None or claims.get("iss") == issuer, "wrong_issuer", f"iss {claims.get('iss')!r} is not {issuer!r}"),
        (_number(claims.get("exp")) and t < claims["exp"] + LEEWAY, "expired", "plan has expired"),
        (_number(claims.get("nbf")) and claims["nbf"] - LEEWAY <= t, "not_yet_valid",
         "plan is not valid yet"),
        (type(claims.get("seq")) is int and claims["seq"] > last_seq, "replayed_seq",  # a JSON true is no seq
         f"seq {claims.get('seq')} is not greater than the last accepted seq {last_seq}"),
        (isinstance(claims.get("argv"), list) and all(isinstance(a, str) for a in claims.get("argv", [None]))
         and claims["argv"][:2] == ["vllm", "serve"], "bad_argv", "argv is not a vllm serve command"),
    ]
    for ok, reason, detail in checks:
        if not ok:
            raise VerificationError(reason, detail)
    return VerifiedPlan(claims=claims, kid=kid)
