"""Plan signing: compact JWS with Ed25519 (RFC 8037 OKP keys; ``alg`` ``Ed25519`` per RFC 9864) via joserfc.

Keys live in a directory as JWK files ``<kid>.jwk`` (mode 0600) plus ``keys.json`` naming the active key and the
retired ones. ``jwks()`` publishes every key not retired, so agents keep verifying plans signed before a rotation.
"""

from __future__ import annotations

import json
import os
import pathlib
import threading
import time
from typing import Any

from joserfc import jws
from joserfc.jwk import OKPKey

PLAN_MEDIA_TYPE = "application/vnd.preflight.plan+jwt"
ALG = "Ed25519"


class KeyError_(RuntimeError):
    """No usable signing key."""


class KeyStore:
    def __init__(self, directory: pathlib.Path, *, create: bool = True):
        self.dir = pathlib.Path(directory)
        self._lock = threading.RLock()
        self._keys: dict[str, OKPKey] = {}
        self._state: dict[str, Any] = {"active": None, "retired": []}
        self._loaded_stamp = 0
        self.load(create=create)

    # -- storage -------------------------------------------------------------------------------------------
    def _state_path(self) -> pathlib.Path:
        return self.dir / "keys.json"

    def _stamp(self) -> int:
        try:
            return self._state_path().stat().st_mtime_ns
        except OSError:
            return 0

    def refresh(self) -> None:
        """Reload when ``preflight keys rotate/retire`` changed the key directory (one stat per call), so a
        running service signs with the new key and publishes the new JWKS without a restart."""
        if self._stamp() != self._loaded_stamp:
            with self._lock:
                if self._stamp() != self._loaded_stamp:
                    self.load(create=False)

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
        if not self._state.get("active") or self._state["active"] not in self._keys:
            if not create:
                raise KeyError_(f"no active signing key in {self.dir}")
            self.rotate()
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

    # -- operations ----------------------------------------------------------------------------------------
    def rotate(self) -> str:
        """Make a new active key; the old ones stay published until retired. Returns the new kid."""
        with self._lock:
            key = OKPKey.generate_key("Ed25519")
            kid = key.thumbprint()[:16]
            self._write_private(kid, key)
            self._keys[kid] = OKPKey.import_key({**key.as_dict(private=True), "kid": kid})
            self._state["active"] = kid
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
            self._save_state()
            self._loaded_stamp = self._stamp()

    @property
    def active_kid(self) -> str:
        return self._state["active"]

    def published(self) -> list[str]:
        return [k for k in self._keys if k not in self._state.get("retired", [])]

    def jwks(self) -> dict[str, Any]:
        self.refresh()
        return {"keys": [
            {**self._keys[k].as_dict(private=False), "kid": k, "alg": ALG, "use": "sig"} for k in self.published()
        ]}

    def derived_secrets(self, label: bytes) -> dict[str, bytes]:
        """Per key (retired ones too), ``sha256(label || 0x00 || private key)``: secrets bound to the signing keys
        for other uses (the audit log's per-event MACs, service/audit.py), cached until the directory changes."""
        self.refresh()
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

    def sign(self, claims: dict[str, Any], typ: str = PLAN_MEDIA_TYPE) -> str:
        """Compact JWS over the claims (sorted-key JSON) with the active key; ``typ`` names the media type."""
        self.refresh()
        kid = self.active_kid
        header = {"alg": ALG, "kid": kid, "typ": typ}
        payload = json.dumps(claims, separators=(",", ":"), sort_keys=True).encode()
        return jws.serialize_compact(header, payload, self._keys[kid], algorithms=[ALG])


def plan_claims(*, issuer: str, audience: str, node: str, plan_id: str, seq: int, ttl: int, manifest_digest: str,
                vllm_version: str, argv: list[str], env: dict[str, str], model_uri: str,
                now: int | None = None) -> dict[str, Any]:
    """The claims of one node's signed plan (times in seconds since the epoch)."""
    iat = int(now if now is not None else time.time())
    return {
        "iss": issuer, "sub": node, "aud": audience, "iat": iat, "nbf": iat - 60, "exp": iat + ttl,
        "jti": plan_id, "seq": seq, "manifest_digest": manifest_digest, "vllm_version": vllm_version,
        "argv": argv, "env": env, "model_uri": model_uri,
    }
