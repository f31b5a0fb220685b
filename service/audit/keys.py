"""Per-event MACs: only a holder of the service's signing keys writes a row the sealer accepts."""

from __future__ import annotations

import hashlib
import hmac

from sqlalchemy.orm import Session

from ..db.models import AuditEvent
from .encoding import head_fields, mac_fields, sealed_fields


class AuditKeys:
    """Per-event MACs with a secret derived from the signing key ``kid`` (``KeyStore.derived_secrets``), so only a
    holder of the service's keys writes a row the sealer accepts. Any key in the key directory (retired ones too)
    verifies; the active one signs. Written at append, ``"a2.<kid>.<hex HMAC(JCS(fields + nonce))>"``; replaced at
    seal by ``"s2.<kid>.<hex HMAC(JCS(fields + nonce, id, seq, prev_hash, hash))>"``, which binds the row's id and
    chain position (a swap of ids, or a row moved, no longer matches). The random ``nonce`` makes every row's MAC
    its own: a copy of a pending row carries the nonce of its original, and the sealer seals only the first.
    Rows written before nonces (migration 0015) carry the older forms, still accepted: ``"<kid>.<hex>"`` over the
    fields at append, ``"s1.<kid>.<hex>"`` sealed. The recorded head (``audit_head``) carries
    ``"h1.<kid>.<hex HMAC(JCS({hash, seq, typ}))>"``."""

    LABEL = b"preflight audit event mac v1"

    def __init__(self, keystore):
        self.keystore = keystore

    def _active(self) -> tuple[str, bytes]:
        secrets = self.keystore.derived_secrets(self.LABEL)
        kid = self.keystore.active_kid
        return kid, secrets[kid]

    def signer(self):
        """``(fields, nonce) -> mac`` with the active key (the key directory is looked at once per call of
        ``signer``): ``fields`` are ``mac_fields`` with the nonce."""
        kid, secret = self._active()
        return lambda fields: f"a2.{kid}.{hmac.new(secret, fields, hashlib.sha256).hexdigest()}"

    def mac(self, fields: bytes) -> str:
        return self.signer()(fields)

    def seal_signer(self):
        """``(event, seq, prev_hash, hash) -> sealed-form MAC`` with the active key: ``s2.`` for a row with a nonce,
        ``s1.`` for one written before nonces."""
        kid, secret = self._active()

        def sign(ev: AuditEvent, seq: int, prev_hash: str, h: str) -> str:
            form = "s2" if ev.nonce is not None else "s1"
            fields = sealed_fields(ev, seq, prev_hash, h, nonce=ev.nonce is not None)
            return f"{form}.{kid}.{hmac.new(secret, fields, hashlib.sha256).hexdigest()}"

        return sign

    def checker(self):
        """``event -> bool``: does the event carry a valid MAC (any key of the directory) — the sealed form when it
        is in the chain, the append form when it is not yet. A row with a nonce must carry a form that covers it."""
        secrets = self.keystore.derived_secrets(self.LABEL)

        def check(ev: AuditEvent) -> bool:
            mac = ev.mac
            if not mac or "." not in mac:
                return False
            head, _, digest = mac.rpartition(".")
            form, _, kid = head.partition(".")
            nonce = ev.nonce
            if ev.chain_seq is not None:
                if form != ("s2" if nonce is not None else "s1"):
                    return False
                fields = sealed_fields(ev, ev.chain_seq, ev.prev_hash, ev.hash, nonce=nonce is not None)
            else:
                if nonce is not None and form != "a2":
                    return False
                if nonce is None:  # the form written before nonces: "<kid>.<hex>"
                    kid = head
                fields = mac_fields(
                    ev.ts, ev.actor, ev.kind, ev.subject, ev.node, ev.plan_id, ev.model, ev.payload_digest, nonce
                )
            secret = secrets.get(kid)
            return secret is not None and hmac.compare_digest(
                digest, hmac.new(secret, fields, hashlib.sha256).hexdigest()
            )

        return check

    def event_valid(self, ev: AuditEvent) -> bool:
        return self.checker()(ev)

    def head_mac(self, seq: int, h: str) -> str:
        kid, secret = self._active()
        return f"h1.{kid}.{hmac.new(secret, head_fields(seq, h), hashlib.sha256).hexdigest()}"

    def head_valid(self, seq: int, h: str, mac: str | None) -> bool:
        """Does ``mac`` vouch for the recorded head ``(seq, h)`` (any key of the directory)?"""
        if not mac or not mac.startswith("h1.") or mac.count(".") < 2:
            return False
        head, _, digest = mac.rpartition(".")
        secret = self.keystore.derived_secrets(self.LABEL).get(head[3:])
        return secret is not None and hmac.compare_digest(
            digest, hmac.new(secret, head_fields(seq, h), hashlib.sha256).hexdigest()
        )


def audit_keys(session: Session) -> AuditKeys | None:
    """The MAC keys of the Database the session belongs to (None: a database used without the service's keys)."""
    db = session.info.get("database")
    return getattr(db, "audit_keys", None)
