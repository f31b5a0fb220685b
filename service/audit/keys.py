"""Per-event MACs: only a holder of the service's signing keys writes a row the sealer accepts."""

from __future__ import annotations

import hashlib
import hmac

from sqlalchemy.orm import Session

from ..db.models import AuditEvent
from .encoding import mac_fields, sealed_fields


class AuditKeys:
    """Per-event MACs with a secret derived from the signing key ``kid`` (``KeyStore.derived_secrets``), so only a
    holder of the service's keys writes a row the sealer accepts. Any key in the key directory (retired ones too)
    verifies; the active one signs. Two forms: written at append, ``"<kid>.<hex HMAC(JCS(fields))>"``; replaced at
    seal by ``"s1.<kid>.<hex HMAC(JCS(fields + id, seq, prev_hash, hash))>"``, which binds the row's id and chain
    position (a swap of ids, or a row moved, no longer matches)."""

    LABEL = b"preflight audit event mac v1"

    def __init__(self, keystore):
        self.keystore = keystore

    def signer(self):
        """``fields -> mac`` with the active key (the key directory is looked at once per call of ``signer``)."""
        secrets = self.keystore.derived_secrets(self.LABEL)
        kid = self.keystore.active_kid
        secret = secrets[kid]
        return lambda fields: f"{kid}.{hmac.new(secret, fields, hashlib.sha256).hexdigest()}"

    def mac(self, fields: bytes) -> str:
        return self.signer()(fields)

    def seal_signer(self):
        """``(event, seq, prev_hash, hash) -> sealed-form MAC`` with the active key."""
        secrets = self.keystore.derived_secrets(self.LABEL)
        kid = self.keystore.active_kid
        secret = secrets[kid]

        def sign(ev: AuditEvent, seq: int, prev_hash: str, h: str) -> str:
            return f"s1.{kid}.{hmac.new(secret, sealed_fields(ev, seq, prev_hash, h), hashlib.sha256).hexdigest()}"

        return sign

    def checker(self):
        """``event -> bool``: does the event carry a valid MAC (any key of the directory) — the sealed form when it
        is in the chain, the append form when it is not yet."""
        secrets = self.keystore.derived_secrets(self.LABEL)

        def check(ev: AuditEvent) -> bool:
            mac = ev.mac
            if not mac or "." not in mac:
                return False
            head, _, digest = mac.rpartition(".")
            if ev.chain_seq is not None:
                if not head.startswith("s1."):
                    return False
                secret = secrets.get(head[3:])
                fields = sealed_fields(ev, ev.chain_seq, ev.prev_hash, ev.hash)
            else:
                secret = secrets.get(head)
                fields = mac_fields(
                    ev.ts, ev.actor, ev.kind, ev.subject, ev.node, ev.plan_id, ev.model, ev.payload_digest
                )
            return secret is not None and hmac.compare_digest(
                digest, hmac.new(secret, fields, hashlib.sha256).hexdigest()
            )

        return check

    def event_valid(self, ev: AuditEvent) -> bool:
        return self.checker()(ev)


def audit_keys(session: Session) -> AuditKeys | None:
    """The MAC keys of the Database the session belongs to (None: a database used without the service's keys)."""
    db = session.info.get("database")
    return getattr(db, "audit_keys", None)
