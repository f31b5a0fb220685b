"""Offline verification of a signed plan, failing closed.

The agent pins the algorithm (Ed25519, or its legacy name EdDSA) and the key type (OKP): ``none``, HMAC and RSA/EC
headers are refused before any key is touched, so algorithm confusion (e.g. HS256 keyed with the public key) cannot
work. Then: a ``kid`` in the node's pinned trust file (service/agent/trust.py), a valid signature, ``typ``, every
claim present with its type, ``iss``, ``sub`` = this node, ``aud``, ``nbf``, an env the node allows
(domain/env_policy.py), and ``seq`` not below the last one this node accepted (the same plan may run again; rollback
protection, like TUF clients). A plan does not expire: a separate freshness statement, signed at fetch time over the
plan's digest (``verify_freshness``), says it is still the node's current plan.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import OKPKey

from ..domain import env_policy
from ..signing import FRESHNESS_MEDIA_TYPE, PLAN_MEDIA_TYPE, b64json, plan_digest

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

    @property
    def role(self) -> str:
        """``replica`` (its own instance), ``head`` (rank 0 of a multi-node instance) or ``worker``."""
        return self.claims.get("role") or "replica"

    @property
    def grouped(self) -> bool:
        """A member of a multi-node instance: it starts only together with its group."""
        return self.role in ("head", "worker")


def verify_jws(token: str, jwks: dict, *, typ: str) -> tuple[dict[str, Any], str]:
    """Check header (pinned alg, ``typ``), ``kid`` and signature; return ``(claims, kid)``. Raises
    VerificationError."""
    if not isinstance(token, str) or token.count(".") != 2:
        raise VerificationError("malformed", "not a compact JWS")
    try:
        header = b64json(token.split(".")[0])
    except Exception:  # not base64, not JSON, nested too deep (RecursionError)
        raise VerificationError("malformed", "unreadable protected header") from None
    if not isinstance(header, dict):
        raise VerificationError("malformed", "the protected header is not a JSON object")
    alg = header.get("alg")
    if alg not in PINNED_ALGS:
        raise VerificationError("alg_refused", f"algorithm {alg!r} is not pinned ({', '.join(PINNED_ALGS)})")
    if header.get("typ") != typ:
        raise VerificationError("typ", f"typ {header.get('typ')!r} is not {typ}")
    kid = header.get("kid")
    jwk = next((k for k in (jwks or {}).get("keys", []) if k.get("kid") == kid), None)
    if jwk is None or not isinstance(kid, str):  # trusted keys have string kids (agent/trust.py, signing.py)
        raise VerificationError("unknown_kid", f"key id {kid!r} is not a key this node trusts")
    if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519" or "d" in jwk:
        raise VerificationError("bad_key", f"key {kid!r} is not a public Ed25519 OKP key")
    try:
        key = OKPKey.import_key({k: v for k, v in jwk.items() if k in ("kty", "crv", "x", "kid")})
        obj = jws.deserialize_compact(token, key, algorithms=[alg])
    except (JoseError, ValueError) as exc:
        raise VerificationError("bad_signature", f"signature does not verify: {exc.__class__.__name__}") from None
    try:
        claims = json.loads(obj.payload)
    except (ValueError, RecursionError):
        raise VerificationError("malformed", "payload is not JSON") from None
    if not isinstance(claims, dict):
        raise VerificationError("malformed", "payload is not a JSON object")
    return claims, kid


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _str_dict(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items())


PLAN_CLAIM_TYPES: dict[str, Callable[[Any], bool]] = {
    "iss": lambda v: isinstance(v, str),
    "sub": lambda v: isinstance(v, str),
    "aud": lambda v: isinstance(v, str),
    "iat": _is_int,
    "nbf": _is_int,
    "jti": lambda v: isinstance(v, str) and 0 < len(v) <= 64,
    "seq": lambda v: _is_int(v) and 1 <= v < 2**53,
    "manifest_digest": lambda v: isinstance(v, str),
    "vllm_version": lambda v: isinstance(v, str),
    "argv": lambda v: isinstance(v, list) and len(v) >= 2 and all(isinstance(a, str) for a in v),
    "env": _str_dict,
    "model_uri": lambda v: isinstance(v, str),
}
# A node's place in its plan (signing.PLACEMENT_CLAIMS): optional (plans signed before multi-node launches carry
# none), all or nothing, each typed.
PLACEMENT_CLAIM_TYPES: dict[str, Callable[[Any], bool]] = {
    "group": lambda v: _is_int(v) and 0 <= v < 2**16,
    "rank": lambda v: _is_int(v) and 0 <= v < 2**16,
    "role": lambda v: v in ("replica", "head", "worker"),
    "nnodes": lambda v: _is_int(v) and 1 <= v < 2**16,
    "head": lambda v: isinstance(v, str) and 0 < len(v) <= 128,
    "group_digest": lambda v: isinstance(v, str) and len(v) == 64,
}
FRESHNESS_CLAIM_TYPES: dict[str, Callable[[Any], bool]] = {
    "iss": lambda v: isinstance(v, str),
    "sub": lambda v: isinstance(v, str),
    "aud": lambda v: isinstance(v, str),
    "iat": _is_int,
    "exp": _is_int,
    "jti": lambda v: isinstance(v, str),
    "seq": lambda v: _is_int(v) and v >= 1,
    "plan_digest": lambda v: isinstance(v, str),
    "acked_seq": lambda v: _is_int(v) and 0 <= v < 2**53,
}


def _check_types(claims: dict, types: dict[str, Callable[[Any], bool]], what: str) -> None:
    for name, ok in types.items():
        if name not in claims:
            raise VerificationError("claim_missing", f"{what} has no {name!r} claim")
        if not ok(claims[name]):
            raise VerificationError(
                "claim_type", f"{what} claim {name!r} has the wrong type or range: {json.dumps(claims[name])[:80]}"
            )


def verify_plan(
    token: str,
    jwks: dict,
    *,
    node: str,
    audience: str,
    issuer: str | None = None,
    last_seq: int = 0,
    last_plan_id: str | None = None,
    now: float | None = None,
) -> VerifiedPlan:
    """Verify a compact JWS plan for ``node`` against the node's trusted keys. Raises VerificationError naming the
    first failed check.

    A plan has no expiry (its freshness is a separate statement, ``verify_freshness``). Replay: a ``seq`` below the
    last accepted one is refused; the same ``seq`` is accepted only for the same plan id (the node's current plan
    runs again at every boot)."""
    claims, kid = verify_jws(token, jwks, typ=PLAN_MEDIA_TYPE)
    _check_types(claims, PLAN_CLAIM_TYPES, "plan")
    t = time.time() if now is None else now
    env_refused = env_policy.refused(claims["env"])
    checks = [
        (claims["sub"].lower() == node.lower(), "wrong_node", f"plan is for node {claims['sub']!r}, not {node!r}"),
        (claims["aud"] == audience, "wrong_audience", f"aud {claims['aud']!r} is not {audience!r}"),
        (issuer is None or claims["iss"] == issuer, "wrong_issuer", f"iss {claims['iss']!r} is not {issuer!r}"),
        (claims["nbf"] - LEEWAY <= t, "not_yet_valid", "plan is not valid yet"),
        (
            claims["seq"] > last_seq or (claims["seq"] == last_seq and claims["jti"] == last_plan_id),
            "replayed_seq",
            f"seq {claims['seq']} (plan {claims['jti']}) is below the last accepted seq {last_seq}"
            + (f" (plan {last_plan_id})" if last_plan_id else ""),
        ),
        (claims["argv"][:2] == ["vllm", "serve"], "bad_argv", "argv is not a vllm serve command"),
        (not env_refused, "env_not_allowed", "; ".join(f"{n}: {why}" for n, why in env_refused)),
    ]
    for ok, reason, detail in checks:
        if not ok:
            raise VerificationError(reason, detail)
    _check_placement(claims, node)
    return VerifiedPlan(claims=claims, kid=kid)


def _check_placement(claims: dict, node: str) -> None:
    """The placement claims, when present, agree with each other and with the argv: a head (rank 0) or replica
    runs without ``--headless``, a worker (rank 1..nnodes-1) with it — so a node runs the role its own claims
    give it (vllm 0.33.0 vllm/entrypoints/cli/serve.py: ``--headless`` starts engine workers without an API
    server)."""
    present = [n for n in PLACEMENT_CLAIM_TYPES if n in claims]
    if not present:
        return
    if len(present) != len(PLACEMENT_CLAIM_TYPES):
        missing = sorted(set(PLACEMENT_CLAIM_TYPES) - set(present))
        raise VerificationError("claim_missing", f"plan has placement claims without {', '.join(missing)}")
    _check_types(claims, PLACEMENT_CLAIM_TYPES, "plan")
    role, rank, nnodes = claims["role"], claims["rank"], claims["nnodes"]
    headless = "--headless" in claims["argv"]
    is_head = claims["head"].lower() == node.lower()  # node names are case-insensitive (stored in lower case)
    consistent = {
        "replica": rank == 0 and nnodes == 1 and is_head and not headless,
        "head": rank == 0 and nnodes > 1 and is_head and not headless,
        "worker": 0 < rank < nnodes and not is_head and headless,
    }[role]
    if not consistent:
        raise VerificationError(
            "bad_placement",
            f"role {role} with rank {rank} of {nnodes}, head "
            f"{claims['head']!r} and{'' if headless else ' no'} --headless "
            f"do not agree",
        )


def verify_freshness(
    token: str,
    jwks: dict,
    *,
    plan_token: str,
    plan: VerifiedPlan,
    node: str,
    audience: str,
    issuer: str | None = None,
    not_before: float | None = None,
    now: float | None = None,
    nonce: str | None = None,
) -> dict[str, Any]:
    """Verify the freshness statement served with a plan: signed by a trusted key, for this node, naming exactly
    this plan (digest, id, seq), not expired, with the plan's seq not below ``acked_seq`` — the highest seq the
    service recorded this node reporting on, so a plan older than one the node already ran is refused even when the
    node's state file was rolled back — and, with ``nonce`` (the one sent with the fetch), echoing it: a plan and
    statement captured earlier and replayed together fail here, so the statement's ``acked_seq`` is today's.
    ``not_before``: refuse a statement signed before this time (a node that lost its state accepts only a statement
    made just now). Returns its claims."""
    if not token:
        raise VerificationError("no_freshness", "the response carries no freshness statement (X-Plan-Freshness)")
    claims, _kid = verify_jws(token, jwks, typ=FRESHNESS_MEDIA_TYPE)
    _check_types(claims, FRESHNESS_CLAIM_TYPES, "freshness statement")
    t = time.time() if now is None else now
    checks = [
        (claims["sub"].lower() == node.lower(), "wrong_node", f"freshness statement is for node {claims['sub']!r}"),
        (claims["aud"] == audience, "wrong_audience", f"aud {claims['aud']!r} is not {audience!r}"),
        (issuer is None or claims["iss"] == issuer, "wrong_issuer", f"iss {claims['iss']!r} is not {issuer!r}"),
        (
            claims["plan_digest"] == plan_digest(plan_token)
            and claims["jti"] == plan.claims["jti"]
            and claims["seq"] == plan.seq,
            "freshness_mismatch",
            "the freshness statement names another plan",
        ),
        (
            nonce is None or claims.get("nonce") == nonce,
            "freshness_replayed",
            "the freshness statement does not echo the nonce sent with this fetch (a replayed answer)",
        ),
        (
            plan.seq >= claims["acked_seq"],
            "below_acked_seq",
            f"seq {plan.seq} (plan {plan.claims['jti']}) is below seq {claims['acked_seq']}, which the service "
            f"recorded this node already reporting on (a rolled-back state file, or a replayed plan)",
        ),
        (claims["iat"] - LEEWAY <= t, "not_yet_valid", "freshness statement is from the future"),
        (t < claims["exp"], "stale", f"freshness statement expired {int(t - claims['exp'])} s ago"),
        (
            not_before is None or claims["iat"] >= not_before,
            "stale",
            "freshness statement was signed before this boot (a node without state accepts only a new one)",
        ),
        (
            not plan.grouped or claims.get("head_group_digest") == plan.claims["group_digest"],
            "group_digest_mismatch",
            f"this node's plan is for group digest {str(plan.claims.get('group_digest'))[:16]}…, but its head "
            f"{plan.claims.get('head')!r} holds {str(claims.get('head_group_digest'))[:16]}… (a half-updated group "
            f"never starts)",
        ),
    ]
    for ok, reason, detail in checks:
        if not ok:
            raise VerificationError(reason, detail)
    return claims
