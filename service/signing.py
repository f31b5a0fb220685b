"""Plan signing: compact JWS with Ed25519 (RFC 8037 OKP keys; ``alg`` ``Ed25519`` per RFC 9864) via joserfc.

Keys live in a directory as JWK files ``<kid>.jwk`` (mode 0600) plus ``keys.json`` naming the active key and the
retired ones. ``jwks()`` publishes every key not retired, so agents keep verifying plans signed before a rotation.

Three kinds of signed statement:

- a **plan** (``typ`` plan+jwt): what one node runs — immutable content, signed once, no expiry;
- a **freshness** statement (``typ`` freshness+jwt, TUF's timestamp role): signed when a node fetches, over the
  plan's digest, node and seq, valid for ``PREFLIGHT_FRESHNESS_TTL_SECONDS``: "this is the node's current plan";
- a **key set** (``typ`` keyset+jwt, TUF's root chaining): version N of the published keys, signed by a key of
  version N-1 (the first by its own key). ``keysets.json`` in the key directory keeps the chain; a node that pinned
  version N-1 accepts version N only through it (service/agent/trust.py).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import pathlib
import threading
import time
from typing import Any, cast

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from joserfc import jws
from joserfc.jwk import OKPKey

PLAN_MEDIA_TYPE = "application/vnd.preflight.plan+jwt"
FRESHNESS_MEDIA_TYPE = "application/vnd.preflight.freshness+jwt"
KEYSET_MEDIA_TYPE = "application/vnd.preflight.keyset+jwt"
CHECKPOINT_MEDIA_TYPE = "application/vnd.preflight.audit-checkpoint+jwt"  # service/audit.py signed checkpoints
ALG = "Ed25519"
# The nonce an agent sends with a plan fetch (header X-Plan-Nonce), echoed in the freshness statement: base64url.
NONCE_PATTERN = r"^[A-Za-z0-9_-]{16,64}$"


def b64json(part: str) -> Any:
    """One base64url part of a compact JWS (unpadded), decoded as JSON (ValueError when it is not)."""
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


_URLSAFE = bytes.maketrans(b"+/", b"-_")


def _b64(data: bytes) -> bytes:
    """Unpadded base64url (what ``base64.urlsafe_b64encode(data).rstrip(b"=")`` gives, without its wrappers)."""
    return binascii.b2a_base64(data, newline=False).translate(_URLSAFE).rstrip(b"=")


# The claims encoding: sorted keys, no spaces, ASCII (json.dumps' defaults otherwise); one encoder, built once.
_CLAIMS_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


_HEADER_SEGMENTS: dict[tuple[str, str, str], bytes] = {}
_ED25519_CLASSES: set[type] = set()


def compact_ed25519(key: OKPKey, header: dict[str, str], payload: bytes) -> str:
    """The compact JWS (RFC 7515 §7.1) over ``payload`` with an Ed25519 key: byte for byte what joserfc's
    ``jws.serialize_compact(header, payload, key, algorithms=["Ed25519"])`` returns (the same header encoding:
    ``json.dumps(ensure_ascii, separators=(",", ":"))``; Ed25519 signatures are deterministic, RFC 8032 §5.1.6 — a
    test holds the two equal), without its per-call registry and key checks: the plan path signs two statements per
    node. Verification stays with joserfc (agent/verify.py)."""
    if len(header) != 3 or header.get("alg") != ALG or "kid" not in header or "typ" not in header:
        raise ValueError("compact_ed25519 signs only {alg: Ed25519, kid, typ} headers")
    cache_key = (ALG, header["kid"], header["typ"])
    head = _HEADER_SEGMENTS.get(cache_key)
    if head is None:
        head = _b64(json.dumps(header, ensure_ascii=True, separators=(",", ":")).encode("ascii"))
        if len(_HEADER_SEGMENTS) < 256:
            _HEADER_SEGMENTS[cache_key] = head
    private = key.private_key
    if type(private) not in _ED25519_CLASSES:  # the ABC check once per class, not per signature
        if not isinstance(private, Ed25519PrivateKey):
            raise ValueError("compact_ed25519 needs an Ed25519 private key")
        _ED25519_CLASSES.add(type(private))
    signing_input = head + b"." + _b64(payload)
    signature = cast(Ed25519PrivateKey, private).sign(signing_input)  # its class was checked above
    return (signing_input + b"." + _b64(signature)).decode("ascii")


def plan_digest(signed: str) -> str:
    """The digest a freshness statement names: SHA-256 over the plan's compact JWS bytes."""
    return "sha256:" + hashlib.sha256(signed.encode()).hexdigest()


class KeyError_(RuntimeError):
    """No usable signing key."""


class KeyStore:
    def __init__(self, directory: pathlib.Path, *, create: bool = True):
        self.dir = pathlib.Path(directory)
        self._state_file = os.fspath(self._state_path())  # stat()ed before every signature (refresh)
        self._lock = threading.RLock()
        self._keys: dict[str, OKPKey] = {}
        self._state: dict[str, Any] = {"active": None, "retired": []}
        self._chain: list[str] = []
        self._loaded_stamp = 0
        self._next_check = 0.0
        self.load(create=create)

    # -- storage -------------------------------------------------------------------------------------------
    def _state_path(self) -> pathlib.Path:
        return self.dir / "keys.json"

    def _stamp(self) -> int:
        try:
            return os.stat(self._state_file).st_mtime_ns
        except OSError:
            return 0

    def refresh(self) -> None:
        """Reload when ``preflight keys rotate/retire`` changed the key directory (one stat per call), so a
        running service signs with the new key and publishes the new JWKS without a restart."""
        if self._stamp() != self._loaded_stamp:
            with self._lock:
                if self._stamp() != self._loaded_stamp:
                    self.load(create=False)

    def refresh_soon(self, every: float = 1.0) -> None:
        """``refresh`` at most once per ``every`` seconds (the agents' hot path: a retired key stops being used
        within a second, for the cost of one stat per second)."""
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + every
            self.refresh()

    def load(self, *, create: bool) -> None:
        if not self.dir.exists():
            if not create:
                raise KeyError_(f"signing key directory {self.dir} does not exist")
            self.dir.mkdir(parents=True, mode=0o700)
        sp = self._state_path()
        if sp.exists():
            self._state = json.loads(sp.read_text())
        keys = {}
        for f in sorted(self.dir.glob("*.jwk")):
            key = OKPKey.import_key(json.loads(f.read_text()))
            keys[f.stem] = key
        self._keys = keys
        self._read_chain()
        if not self._state.get("active") or self._state["active"] not in self._keys:
            if not create:
                raise KeyError_(f"no active signing key in {self.dir}")
            self.rotate()
        self._load_chain()
        self._loaded_stamp = self._stamp()

    def _write_private(self, kid: str, key: OKPKey) -> None:
        path = self.dir / f"{kid}.jwk"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({**key.as_dict(private=True), "kid": kid}, fh)
        os.chmod(path, 0o600)

    def _save_state(self) -> None:
        tmp = self._state_path().with_suffix(".tmp")
        tmp.write_text(json.dumps(self._state, indent=2))
        os.replace(tmp, self._state_path())

    # -- the key-set chain ---------------------------------------------------------------------------------
    def _chain_path(self) -> pathlib.Path:
        return self.dir / "keysets.json"

    def _load_chain(self) -> None:
        """Read ``keysets.json``; when its last key set is not the published one (a key directory from before the
        chain, or keys changed by hand), append a statement signed by the active key. A read-only key directory
        keeps that statement in memory (its bytes are deterministic: Ed25519 and no time in it)."""
        if self._chain_keys() != self.public_keys():
            self._append_keyset(self._state["active"])

    def _read_chain(self) -> None:
        try:
            chain = json.loads(self._chain_path().read_text()).get("keysets", [])
            self._chain = [c for c in chain if isinstance(c, str)]
        except (OSError, ValueError, AttributeError):
            self._chain = []

    def _chain_keys(self) -> list[dict] | None:
        if not self._chain:
            return None
        try:
            part = self._chain[-1].split(".")[1]
            return b64json(part)["keys"]
        except (IndexError, ValueError, KeyError, TypeError):
            return None  # an unreadable last entry: the published set is appended after it

    def _append_keyset(self, signer: str) -> None:
        claims = {"iss": "preflight-keys", "version": len(self._chain) + 1, "keys": self.public_keys()}
        header = {"alg": ALG, "kid": signer, "typ": KEYSET_MEDIA_TYPE}
        payload = json.dumps(claims, separators=(",", ":"), sort_keys=True).encode()
        self._chain.append(jws.serialize_compact(header, payload, self._keys[signer], algorithms=[ALG]))
        with contextlib.suppress(OSError):
            tmp = self._chain_path().with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"keysets": self._chain}, indent=1))
            os.replace(tmp, self._chain_path())

    def keysets(self, after: int = 0) -> list[str]:
        """The key-set statements with a version above ``after``, oldest first."""
        self.refresh()
        return self._chain[after:]

    @property
    def keyset_version(self) -> int:
        return len(self._chain)

    # -- operations ----------------------------------------------------------------------------------------
    def rotate(self) -> str:
        """Make a new active key; the old ones stay published until retired. The new key set is signed by the
        previous active key (nodes trust it already), the first one by itself. Returns the new kid."""
        with self._lock:
            previous = self._state.get("active") if self._state.get("active") in self._keys else None
            while True:  # a kid never starts with "-" (a command line would read it as an option)
                key = OKPKey.generate_key("Ed25519")
                kid = key.thumbprint()[:16]
                if not kid.startswith("-"):
                    break
            self._write_private(kid, key)
            self._keys[kid] = OKPKey.import_key({**key.as_dict(private=True), "kid": kid})
            self._state["active"] = kid
            self._append_keyset(previous or kid)
            self._save_state()
            self._loaded_stamp = self._stamp()
            return kid

    def retire(self, kid: str) -> None:
        """Stop publishing ``kid`` (plans it signed no longer verify). The active key cannot be retired."""
        with self._lock:
            if kid not in self._keys:
                raise KeyError_(f"unknown key id {kid!r}")
            if kid == self._state["active"]:
                raise KeyError_(f"{kid} is the active key: rotate first")
            if kid not in self._state["retired"]:
                self._state["retired"].append(kid)
                self._append_keyset(self._state["active"])
            self._save_state()
            self._loaded_stamp = self._stamp()

    @property
    def active_kid(self) -> str:
        return self._state["active"]

    def published(self) -> list[str]:
        return [k for k in self._keys if k not in self._state.get("retired", [])]

    def public_keys(self) -> list[dict[str, Any]]:
        return [
            {**self._keys[k].as_dict(private=False), "kid": k, "alg": ALG, "use": "sig"}
            for k in sorted(self.published())
        ]

    def audit_jwks(self) -> dict[str, Any]:
        """Every public key in the directory, retired ones too: what signed an audit checkpoint years ago still
        verifies it for an auditor (nodes trust only the published set)."""
        self.refresh()
        return {
            "keys": [
                {**self._keys[k].as_dict(private=False), "kid": k, "alg": ALG, "use": "sig"} for k in sorted(self._keys)
            ],
            "version": self.keyset_version,
        }

    def jwks(self) -> dict[str, Any]:
        """The published keys, and ``version``: the key-set version they are (a node pins this file)."""
        self.refresh()
        return {"keys": self.public_keys(), "version": self.keyset_version}

    def derived_secrets(self, label: bytes) -> dict[str, bytes]:
        """Per key (retired ones too), ``sha256(label || 0x00 || private key)``: secrets bound to the signing keys
        for other uses (the audit log's per-event MACs, service/audit.py), cached until the directory changes (looked
        at most once a second: a rotation reaches the MACs as it reaches freshness statements)."""
        self.refresh_soon()
        cache = self.__dict__.setdefault("_derived", {})
        hit = cache.get(label)
        if hit is None or hit[0] != self._loaded_stamp or set(hit[1]) != set(self._keys):
            import base64
            import hashlib

            out = {}
            for kid, key in self._keys.items():
                d = key.as_dict(private=True)["d"]
                raw = base64.urlsafe_b64decode(d + "=" * (-len(d) % 4))
                out[kid] = hashlib.sha256(label + b"\x00" + raw).digest()
            hit = cache[label] = (self._loaded_stamp, out)
        return hit[1]

    def sign(self, claims: dict[str, Any], typ: str = PLAN_MEDIA_TYPE, *, refresh: bool = True) -> str:
        """Compact JWS over the claims (sorted-key JSON) with the active key; ``typ`` names the media type.
        ``refresh=False``: the caller has just refreshed (throttled) the key directory itself."""
        if refresh:
            self.refresh()
        kid = self.active_kid
        payload = _CLAIMS_JSON.encode(claims).encode()
        return compact_ed25519(self._keys[kid], {"alg": ALG, "kid": kid, "typ": typ}, payload)


# The node's place in its plan (domain/topology.py): ``group`` (instance index), ``rank`` in it, ``role``
# (replica | head | worker), ``nnodes`` (nodes of the instance), ``head`` (the rank-0 node) and ``group_digest``
# (SHA-256 over the whole group's signed content, the same on every member).
PLACEMENT_CLAIMS = ("group", "rank", "role", "nnodes", "head", "group_digest")


def plan_claims(
    *,
    issuer: str,
    audience: str,
    node: str,
    plan_id: str,
    seq: int,
    manifest_digest: str,
    vllm_version: str,
    argv: list[str],
    env: dict[str, str],
    model_uri: str,
    placement: dict[str, Any] | None = None,
    now: int | None = None,
    node_checks: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The claims of one node's signed plan (times in seconds since the epoch). No ``exp``: what a plan says does
    not expire; whether it is still the node's current plan is what a freshness statement says. ``placement``:
    the PLACEMENT_CLAIMS."""
    iat = int(now if now is not None else time.time())
    return {
        "iss": issuer,
        "sub": node,
        "aud": audience,
        "iat": iat,
        "nbf": iat - 60,
        "jti": plan_id,
        "seq": seq,
        "manifest_digest": manifest_digest,
        "vllm_version": vllm_version,
        "argv": argv,
        "env": env,
        "model_uri": model_uri,
        **(placement or {}),
        # what the agent checks before vLLM starts (domain/node_checks.py); older plans carry none
        **({"node_checks": node_checks} if node_checks is not None else {}),
    }


def freshness_claims(
    *,
    issuer: str,
    audience: str,
    node: str,
    plan_id: str,
    seq: int,
    digest: str,
    ttl: int,
    acked_seq: int,
    now: int | None = None,
    head_group_digest: str | None = None,
    grouped: bool = False,
    nonce: str | None = None,
) -> dict[str, Any]:
    """A freshness statement: "the plan with this digest (id, seq) is node's current plan", valid ``ttl`` s.
    ``acked_seq``: the highest seq the node itself reported on (services/nodes.py ``acked_seqs``) — the agent
    refuses a plan below it whatever its own state file says. ``nonce``: the one the agent sent with its fetch,
    echoed, so a statement captured earlier cannot be replayed with its plan. For a member of a multi-node group
    (``grouped``) also ``head_group_digest``: the group digest of the plan its head currently holds (null when the
    head holds none)."""
    iat = int(now if now is not None else time.time())
    out = {
        "iss": issuer,
        "sub": node,
        "aud": audience,
        "iat": iat,
        "exp": iat + ttl,
        "jti": plan_id,
        "seq": seq,
        "plan_digest": digest,
        "acked_seq": acked_seq,
    }
    if nonce is not None:
        out["nonce"] = nonce
    if grouped:
        out["head_group_digest"] = head_group_digest
    return out
