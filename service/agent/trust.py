"""The node's trust root: a JWKS file pinned at provisioning, updated only through a signed key-set chain.

The file is a JWKS (``{"keys": [...], "version": N}``) — ``/.well-known/jwks.json`` saved, or written by
``preflight keys export``. Plans, freshness statements and new key sets verify only against these keys; the keys a
server happens to serve are never trusted by themselves.

Rotation reaches nodes without re-provisioning (TUF's root chaining): the service publishes every key set as a
statement ``{"version": N, "keys": [...]}`` signed by a key of version N-1 (``GET /v1/keysets?after=N``). The agent
applies the statements above its version in order; each must be signed by a key it trusts at that moment and carry
exactly the next version. The first that fails stops the walk, and the trust file keeps the last good version.
Statements at or below the pinned version are ignored, so an old key set cannot be replayed.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from dataclasses import dataclass, field
from typing import Any

from ..signing import KEYSET_MEDIA_TYPE
from .files import UnsafeFile, read_file
from .verify import VerificationError, verify_jws

KEYSET_ISSUER = "preflight-keys"
MAX_KEYS = 64
MAX_TRUST_BYTES = 1 << 20  # 64 public keys are a few kB


class TrustError(Exception):
    """The trust file is missing or unusable."""


def _check_keys(keys: Any, where: str) -> list[dict]:
    if not isinstance(keys, list) or not keys or len(keys) > MAX_KEYS:
        raise ValueError(f"{where}: 'keys' must be a non-empty list of at most {MAX_KEYS} keys")
    out = []
    for i, k in enumerate(keys):
        if (
            not isinstance(k, dict)
            or k.get("kty") != "OKP"
            or k.get("crv") != "Ed25519"
            or not isinstance(k.get("x"), str)
            or not isinstance(k.get("kid"), str)
            or "d" in k
        ):
            raise ValueError(f"{where}: keys[{i}] is not a public Ed25519 OKP key with a kid")
        out.append({n: k[n] for n in ("kty", "crv", "x", "kid")})
    return out


@dataclass
class Trust:
    path: pathlib.Path
    keys: list[dict] = field(default_factory=list)
    version: int = 0

    @property
    def jwks(self) -> dict[str, Any]:
        return {"keys": self.keys}

    @classmethod
    def load(cls, path: pathlib.Path) -> Trust:
        try:  # never through a symlink, only a regular file, bounded (agent/files.py)
            data = json.loads(read_file(path, limit=MAX_TRUST_BYTES, what="trust file", follow=True))
        except UnsafeFile as exc:
            raise TrustError(str(exc)) from None
        except FileNotFoundError:
            raise TrustError(
                f"trust file {path} does not exist: install the service's JWKS at provisioning "
                f"(curl $S/.well-known/jwks.json > {path}, or `preflight keys export --out {path}`)"
            ) from None
        except (OSError, ValueError, RecursionError) as exc:
            raise TrustError(f"trust file {path} is unreadable: {exc.__class__.__name__}") from None
        try:
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            version = data.get("version", 0)
            if isinstance(version, bool) or not isinstance(version, int) or version < 0:
                raise ValueError("'version' must be a non-negative integer")
            return cls(path=pathlib.Path(path), keys=_check_keys(data.get("keys"), "trust file"), version=version)
        except ValueError as exc:
            raise TrustError(f"trust file {path} is not a usable JWKS: {exc}") from None

    def save(self) -> None:
        """Atomically: a temporary file in the same directory, fsynced, renamed over the old one."""
        write_atomic(self.path, {"keys": self.keys, "version": self.version})

    def apply_chain(self, statements: Any) -> list[int]:
        """Apply the key-set statements above this version, in order. Returns the versions applied. Raises
        VerificationError (``keyset_*``) at the first statement that does not chain from the keys trusted at
        that point; the statements applied before it stand (each was signed by a key trusted then)."""
        if not isinstance(statements, list):
            raise VerificationError("keyset_malformed", "the key-set chain is not a list")
        keys, version, applied = self.keys, self.version, []
        try:
            for token in statements:
                try:
                    claims, _kid = verify_jws(token, {"keys": keys}, typ=KEYSET_MEDIA_TYPE)
                except VerificationError as exc:
                    if exc.reason == "unknown_kid":
                        raise VerificationError(
                            "keyset_untrusted", f"a key set is signed by a key this node does not trust ({exc.detail})"
                        ) from None
                    raise VerificationError("keyset_" + exc.reason, exc.detail) from None
                v = claims.get("version")
                if isinstance(v, bool) or not isinstance(v, int):
                    raise VerificationError("keyset_malformed", "key set without an integer version")
                if v <= version:
                    continue  # already trusted (or older): never rolls back
                if v != version + 1:
                    raise VerificationError("keyset_gap", f"key set version {v} does not follow {version}")
                if claims.get("iss") != KEYSET_ISSUER:
                    raise VerificationError("keyset_malformed", f"key set iss {claims.get('iss')!r}")
                try:
                    keys = _check_keys(claims.get("keys"), f"key set {v}")
                except ValueError as exc:
                    raise VerificationError("keyset_malformed", str(exc)) from None
                version = v
                applied.append(v)
        finally:
            if applied:
                self.keys, self.version = keys, version
                self.save()
        return applied


def write_atomic(path: pathlib.Path, data: Any) -> None:
    """``data`` as JSON at ``path``: written in full and synced, then renamed into place (never half a file)."""
    write_text_atomic(path, json.dumps(data))


def write_text_atomic(path: pathlib.Path, text: str) -> None:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
