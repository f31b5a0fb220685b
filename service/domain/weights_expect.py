"""What a node must find in its weights directory before vLLM starts, whatever way the manifest was registered: the
signed claim ``node_checks.weights_expected`` (service/agent/bootcheck.py compares it with the disk).

    {"config_digest": "sha256:<hex>" | None,   # config.json, canonical JSON (``config_digest`` below)
     "quantization": "awq" | "none",            # the tag quantization.txt must carry (no file: none)
     "layout_digest": "..."                      # only when the manifest has one (the tensor inventory, issue 28)
     "weights_check": "verify" | "skip",        # skip: signed on purpose, audited at plan creation
     "skip_reason": "..."                        # with skip: why, as the deployer gave it
     "unchecked": "refuse" | "start",           # what a node with nothing to compare does (production: refuse)
     "signature": {"public_key": "<PEM>"}        # only when the plan names a signer: the weights directory's
                | {"identity": "...", "oidc_issuer": "https://..."}}  # OpenSSF model signature (model.sig)
                                                 # must verify with it (service/agent/provenance.py)

The config digest is over the *parsed* config, so the same JSON computes the same digest from the manifest the
service stored (``POST /v1/manifests``' ``config`` object) and from the node's ``config.json`` file, whatever its
whitespace or key order: SHA-256 over ``json.dumps(config, sort_keys=True, separators=(",", ":"),
ensure_ascii=True, allow_nan=False)`` encoded as ASCII — by hand::

    python3 -c 'import hashlib,json,sys; print("sha256:" + hashlib.sha256(json.dumps(json.load(open(sys.argv[1])),
        sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()).hexdigest())' config.json

Pure: no I/O here; the agent reads the files (bounded, service/agent/weights.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from .errors import DomainError
from .quant_tag import parse_quantization_txt
from .versions import all_quant_methods

CLAIM = "weights_expected"
NONE = "none"
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# a vLLM quantization method name as quantization.txt spells it (lower-cased by quant_tag.py): awq, gptq_marlin,
# compressed-tensors, modelopt_fp4, …
TAG = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
# the tensor inventory's layout digest (its format is that module's): a bounded token, never free text
LAYOUT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:_+.=-]{0,159}$")
MAX_REASON = 1000
KEYS = {"config_digest", "quantization", "layout_digest", "weights_check", "skip_reason", "unchecked", "signature"}
# The signer a plan may name (``signature``): an elliptic-curve public key, as model-signing's key verifier reads
# it (PEM SubjectPublicKeyInfo on the curves of model_signing 1.1.1 _signing/sign_ec_key.py:50), or a Sigstore
# certificate identity and the OIDC issuer that vouched for it (model_signing 1.1.1 verifying.py:221-227).
SIGNER_CURVES = ("secp256r1", "secp384r1", "secp521r1")
MAX_PEM = 4096
MAX_IDENTITY = 512


def signer_problem(signer: Any) -> str | None:
    """Why ``signer`` is not a signer a node can verify with (None when it is): exactly ``{"public_key": PEM}`` or
    ``{"identity": ..., "oidc_issuer": "https://..."}``, bounded."""
    if not isinstance(signer, dict):
        return "must be an object"
    keys = set(signer)
    if keys == {"public_key"}:
        return _public_key_problem(signer["public_key"])
    if keys == {"identity", "oidc_issuer"}:
        for k in ("identity", "oidc_issuer"):
            v = signer[k]
            if not (isinstance(v, str) and 0 < len(v) <= MAX_IDENTITY and v.isprintable() and v.strip() == v):
                return f"{k} must be printable text of 1..{MAX_IDENTITY} characters"
        if not signer["oidc_issuer"].startswith("https://"):
            return "oidc_issuer must be an https:// URL"
        return None
    return "must be {public_key} (a PEM elliptic-curve public key) or {identity, oidc_issuer} (Sigstore)"


def _public_key_problem(pem: Any) -> str | None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if not (isinstance(pem, str) and 0 < len(pem) <= MAX_PEM and pem.isascii()):
        return f"public_key must be PEM text of at most {MAX_PEM} ASCII characters"
    try:
        key = serialization.load_pem_public_key(pem.encode("ascii"))
    except (ValueError, TypeError):  # not PEM, or not a key cryptography reads
        return "public_key is not a PEM public key"
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in SIGNER_CURVES:
        return f"public_key must be an elliptic-curve key on {', '.join(SIGNER_CURVES)} (what model-signing verifies)"
    return None


def canonical_config(config: Any) -> bytes:
    """The bytes the config digest is over (see the module docstring). Raises ValueError (NaN, Infinity, a value
    JSON has no form for) or RecursionError (nesting deeper than Python's JSON encoder goes)."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def config_digest(config: Any) -> str | None:
    """``sha256:<hex>`` over the canonical config; None when the config has no canonical form (NaN, too deep)."""
    try:
        return "sha256:" + hashlib.sha256(canonical_config(config)).hexdigest()
    except (ValueError, TypeError, RecursionError):
        return None


def expected_tag(quantization_txt: str | None) -> str:
    """The tag the node's quantization.txt must carry: the manifest's method, or ``none`` (no tag file registered,
    or one saying ``none``). A tag the service could not read is refused at registration (services/manifests.py),
    so DomainError here is a stored manifest from before that check: it is raised, never guessed."""
    if quantization_txt is None:
        return NONE
    return parse_quantization_txt(quantization_txt, all_quant_methods()).method or NONE


def weights_expected_claim(
    *,
    config: Any,
    quantization_txt: str | None,
    layout_digest: str | None,
    environment: str,
    weights_check: str = "verify",
    skip_reason: str | None = None,
    signer: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The claim for one plan (see the module docstring). ``unchecked``: a production plan is refused by a node that
    has nothing to compare (a remote uri with no local mapping); a benchmark plan starts, said on the console — the
    tuning loop signs benchmark plans by itself on scratch nodes that may load the weights from the hub, and nothing
    it measures is served (docs/agent.md)."""
    if weights_check not in ("verify", "skip"):
        raise DomainError("weights_check", f"weights_check is {weights_check!r}: verify or skip", rule="weights_check")
    if layout_digest is not None and not LAYOUT.fullmatch(layout_digest):
        raise DomainError("layout_digest", "the manifest's layout digest is not a digest token", rule="layout_digest")
    out: dict[str, Any] = {
        "config_digest": config_digest(config),
        "quantization": expected_tag(quantization_txt),
        "weights_check": weights_check,
        "unchecked": "refuse" if environment == "production" else "start",
    }
    if layout_digest is not None:
        out["layout_digest"] = layout_digest
    if weights_check == "skip":
        out["skip_reason"] = (skip_reason or "")[:MAX_REASON]
    if signer is not None:
        problem = signer_problem(signer)
        if problem:
            raise DomainError("weights_signer", f"weights_signer {problem}", rule="weights_signer")
        out["signature"] = dict(signer)
    return out


def claim_problem(claim: Any) -> str | None:
    """Why a ``weights_expected`` claim cannot be used (None when it can). Signed, so a problem is a service bug or a
    newer service: refused by the node rather than half-checked, never a crash."""
    if not isinstance(claim, dict):
        return f"node_checks.{CLAIM} must be an object"
    unknown = sorted(str(k)[:40] for k in claim if k not in KEYS)
    if unknown:
        return f"node_checks.{CLAIM} has keys this agent does not know: {', '.join(unknown[:5])}"
    d = claim.get("config_digest")
    if d is not None and not (isinstance(d, str) and DIGEST.fullmatch(d)):
        return f"node_checks.{CLAIM}.config_digest must be sha256:<64 hex digits> or null"
    q = claim.get("quantization")
    if not (isinstance(q, str) and TAG.fullmatch(q)):
        return f"node_checks.{CLAIM}.quantization must be a quantization method name or none"
    lay = claim.get("layout_digest")
    if lay is not None and not (isinstance(lay, str) and LAYOUT.fullmatch(lay)):
        return f"node_checks.{CLAIM}.layout_digest must be a digest token"
    if claim.get("weights_check") not in ("verify", "skip"):
        return f"node_checks.{CLAIM}.weights_check must be verify or skip"
    if claim.get("unchecked") not in ("refuse", "start"):
        return f"node_checks.{CLAIM}.unchecked must be refuse or start"
    reason = claim.get("skip_reason")
    if reason is not None and not (isinstance(reason, str) and len(reason) <= MAX_REASON):
        return f"node_checks.{CLAIM}.skip_reason must be text of at most {MAX_REASON} characters"
    if "signature" in claim:
        problem = signer_problem(claim["signature"])
        if problem:
            return f"node_checks.{CLAIM}.signature {problem}"
    return None
