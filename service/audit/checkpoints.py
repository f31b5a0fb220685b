"""Signed checkpoints of the chain (RFC 6962's signed tree head): made by the sealer, stored, written to a file
outside the database, served to agents and auditors, and compared with the chain by verify."""

from __future__ import annotations

import datetime as dt
import logging
import os
import pathlib
import threading
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..clock import SYSTEM, Clock, utc
from ..db.models import AuditCheckpoint, AuditEvent, table_of, utcnow
from ..signing import CHECKPOINT_MEDIA_TYPE
from . import head
from .encoding import GENESIS, canonical, hash_of, ids_step, sha256_hex
from .keys import audit_keys
from .verify import verify_chain

log = logging.getLogger("preflight.audit")

CHECKPOINT_TYPE = CHECKPOINT_MEDIA_TYPE


def checkpoint_claims(session: Session, issuer: str) -> dict[str, Any]:
    """The sealed chain's head as of now (read under the chain lock by callers that store it), to be signed with the
    service key: ``{"iss", "iat", "typ", "events", "last_seq", "head", "ids_digest"}``. Raises ValueError when the
    chain is broken (a checkpoint never vouches for one)."""
    out = verify_chain(session, up_to=None)
    if not out["ok"] and "first_broken" in out:
        raise ValueError(f"audit chain broken at event {out['first_broken']['id']}: {out['first_broken']['reason']}")
    return {
        "iss": issuer,
        "iat": int(utcnow().timestamp()),
        "events": out["events"],
        "last_seq": out["last_seq"],
        "head": out["head"],
        "ids_digest": out["ids_digest"],
        "typ": "audit-checkpoint",
    }


def check_checkpoint(session: Session, claims: dict[str, Any]) -> dict[str, Any]:
    """Recompute a (signature-verified) checkpoint against this database: the chain up to ``last_seq`` must be
    intact, hold the same number of events, end in the same head hash and (newer checkpoints) the same ids."""
    out = verify_chain(session, up_to=int(claims["last_seq"]))
    if not out["ok"]:
        return {"ok": False, "reason": "chain broken", "first_broken": out["first_broken"]}
    if (
        out["events"] != claims["events"]
        or out["head"] != claims["head"]
        or (claims.get("ids_digest") and out["ids_digest"] != claims["ids_digest"])
    ):
        return {
            "ok": False,
            "reason": "the chain up to the checkpoint differs (events deleted, inserted, edited or renumbered)",
            "expected": {"events": claims["events"], "head": claims["head"]},
            "found": {"events": out["events"], "head": out["head"]},
        }
    return {"ok": True, "events": out["events"], "head": out["head"], "last_seq": out["last_seq"]}


class Checkpointer:
    """Signed checkpoints made by the sealer: one when ``every_events`` events were sealed since the newest, or when
    the chain grew and ``every_seconds`` passed. Each is stored (``audit_checkpoints``) and written to ``path`` (the
    data dir: a copy the database cannot take back). The id digest continues from the newest checkpoint whose
    signature verifies, so a checkpoint costs the events since the last one, not the whole chain."""

    def __init__(
        self, keys, issuer: str, path: pathlib.Path, *, every_events: int, every_seconds: float, clock: Clock = SYSTEM
    ):
        self.keys, self.issuer, self.path = keys, issuer, pathlib.Path(path)
        self.every_events, self.every_seconds, self.clock = every_events, every_seconds, clock
        self._warned = float("-inf")

    def _verified(self, signed: str) -> dict[str, Any] | None:
        from ..agent.verify import VerificationError, verify_jws

        try:
            claims, _ = verify_jws(signed, self.keys.jwks(), typ=CHECKPOINT_TYPE)
        except VerificationError:
            return None
        return claims

    def newest_row(self, session: Session) -> AuditCheckpoint | None:
        return session.execute(select(AuditCheckpoint).order_by(AuditCheckpoint.last_seq.desc()).limit(1)).scalar()

    def maybe(self, session: Session) -> AuditCheckpoint | None:
        """Inside a sealing transaction (the chain lock held): make a checkpoint when one is due."""
        head = session.execute(select(func.max(AuditEvent.chain_seq))).scalar() or 0
        newest = self.newest_row(session)
        if head == 0 or (newest is not None and newest.last_seq >= head):
            return None
        if newest is not None and head - newest.last_seq < self.every_events:
            created = newest.created_at if newest.created_at.tzinfo else newest.created_at.replace(tzinfo=dt.UTC)
            if (utc(self.clock) - created).total_seconds() < self.every_seconds:
                return None
        try:
            with session.begin_nested():  # a refused checkpoint leaves the seal it rides on intact
                return self.make(session, newest)
        except ValueError as exc:
            now = self.clock.monotonic()
            if now - self._warned > 60:
                self._warned = now
                log.error("audit checkpoint refused: %s (verify reports the break)", exc)
            return None

    def make(self, session: Session, newest: AuditCheckpoint | None = None) -> AuditCheckpoint | None:
        """A checkpoint of the sealed chain now (the chain lock held). None when the chain is empty or already
        checkpointed at its head. Raises ValueError when the chain since the previous checkpoint does not verify:
        every event's link, payload digest, hash and MAC is recomputed before the service signs anything, so the
        service never vouches for rows it did not write. ``macs_from`` (the first seq from which every event
        carries a MAC; events sealed before MACs existed have none) is carried from checkpoint to checkpoint, so a
        database writer cannot strip MACs and pass the rows off as older. With no verified checkpoint in the
        database, the data-dir file must still lie on the chain (same head and ids at its seq)."""
        newest = newest if newest is not None else self.newest_row(session)
        start = self._verified(newest.signed) if newest is not None else None
        seq, prev, ids, count, macs_from = 0, GENESIS, GENESIS, 0, None
        if start is not None and start.get("ids_digest"):
            seq, prev, ids, count = start["last_seq"], start["head"], start["ids_digest"], start["events"]
            macs_from = start.get("macs_from")
        try:
            on_file = read_checkpoint_file(self.path, self.keys.jwks())
        except ValueError:
            on_file = None
        keys = audit_keys(session)
        valid = keys.checker() if keys is not None else None
        last_without_mac = None
        while True:
            # Core rows (attribute access like the ORM's, no identity map: the sealing transaction's objects stay)
            table = table_of(AuditEvent)
            rows = session.execute(
                select(table).where(table.c.chain_seq > seq).order_by(table.c.chain_seq).limit(2000)
            ).all()
            if not rows:
                break
            for ev in rows:
                if ev.chain_seq != seq + 1 or ev.prev_hash != prev:
                    raise ValueError(f"audit chain broken at event {ev.id}: does not link to the previous event")
                if (
                    sha256_hex(canonical(ev.payload)) != ev.payload_digest
                    or hash_of(ev, ev.chain_seq, ev.prev_hash) != ev.hash
                ):
                    raise ValueError(f"audit chain broken at event {ev.id}: its hash does not match its fields")
                if ev.mac is None:
                    if macs_from is not None and ev.chain_seq >= macs_from:
                        raise ValueError(f"audit event {ev.id} has no MAC after MACs began (seq {macs_from})")
                    last_without_mac = ev.chain_seq
                elif valid is not None and not valid(ev):
                    raise ValueError(f"audit event {ev.id}: its MAC does not match (not written by the service)")
                seq, prev, ids, count = ev.chain_seq, ev.hash, ids_step(ids, ev.chain_seq, ev.id), count + 1
                if (
                    on_file is not None
                    and seq == int(on_file.get("last_seq", -1))
                    and (prev != on_file.get("head") or (on_file.get("ids_digest") and ids != on_file["ids_digest"]))
                ):
                    raise ValueError(
                        f"the audit chain at seq {seq} differs from the data-dir checkpoint: history was rewritten"
                    )
        if count == 0 or (newest is not None and newest.last_seq >= seq):
            return None
        trouble = head.problem(session, head.recorded(session), seq, prev, keys)
        if trouble is not None:  # never vouch for a chain whose tail was cut (or whose head was forged)
            raise ValueError(trouble.reason)
        if on_file is not None and int(on_file.get("last_seq", 0)) > seq:
            raise ValueError(f"the data-dir checkpoint covers {on_file['last_seq']} events but the chain ends at {seq}")
        if macs_from is None:
            macs_from = (last_without_mac or 0) + 1
        return self._store(session, seq=seq, head_hash=prev, ids=ids, count=count, macs_from=macs_from)

    def _store(
        self, session: Session, *, seq: int, head_hash: str, ids: str, count: int, macs_from: int
    ) -> AuditCheckpoint:
        claims = {
            "iss": self.issuer,
            "iat": int(self.clock.time()),
            "typ": "audit-checkpoint",
            "events": count,
            "last_seq": seq,
            "head": head_hash,
            "ids_digest": ids,
            "macs_from": macs_from,
        }
        row = AuditCheckpoint(
            last_seq=seq,
            events=count,
            head=head_hash,
            ids_digest=ids,
            kid=self.keys.active_kid,
            signed=self.keys.sign(claims, typ=CHECKPOINT_TYPE),
        )
        session.add(row)
        session.flush()
        return row

    def publish(self, row: AuditCheckpoint) -> None:
        """Write the checkpoint to the data-dir file (atomically; only ever replaced by a longer chain's)."""
        try:
            try:
                current = read_checkpoint_file(self.path, self.keys.jwks())
            except ValueError as exc:  # a file that does not verify (edited, or its key retired): replaced
                log.warning("audit checkpoint file replaced: %s", exc)
                current = None
            if current is not None and int(current["last_seq"]) >= row.last_seq:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(row.signed + "\n")
            os.replace(tmp, self.path)
        except OSError as exc:
            log.error("audit checkpoint file %s not written: %s", self.path, exc)


def read_checkpoint_file(path: pathlib.Path, jwks: dict) -> dict[str, Any] | None:
    """The verified claims of a saved checkpoint file, or None when there is no file. Raises ValueError when the file
    exists but its signature does not verify (a checkpoint file is never silently ignored)."""
    from ..agent.verify import VerificationError, verify_jws

    try:
        signed = pathlib.Path(path).read_text().strip()
    except FileNotFoundError:
        return None
    try:
        claims, _ = verify_jws(signed, jwks, typ=CHECKPOINT_TYPE)
    except VerificationError as exc:
        raise ValueError(f"checkpoint {path} does not verify: {exc}") from None
    return claims


def known_checkpoints(session: Session, jwks: dict, files: Sequence[pathlib.Path] = ()) -> tuple[list[dict], list[str]]:
    """The checkpoints verify compares the chain with: the newest stored one whose signature verifies, and each file
    given (the data-dir copy, one an auditor saved). Returns (claims with a ``source``, problems)."""
    from ..agent.verify import VerificationError, verify_jws

    found: list[dict] = []
    problems: list[str] = []
    for row in session.execute(select(AuditCheckpoint).order_by(AuditCheckpoint.last_seq.desc()).limit(20)).scalars():
        try:
            claims, _ = verify_jws(row.signed, jwks, typ=CHECKPOINT_TYPE)
        except VerificationError as exc:
            problems.append(f"stored checkpoint {row.id} does not verify ({exc}): ignored")
            continue
        found.append({**claims, "source": "database"})
        break
    for f in files:
        try:
            on_file = read_checkpoint_file(f, jwks)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if on_file is not None:
            found.append({**on_file, "source": str(f)})
    return found, problems
