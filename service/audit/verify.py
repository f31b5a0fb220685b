"""Verification, read-only: the sealed chain recomputed link by link, every MAC checked, rows outside the chain
reported, and the chain compared with the checkpoints it must still match."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import exists, func, or_, select
from sqlalchemy.orm import Session, aliased

from ..db.models import AuditEvent, utcnow
from . import head
from .encoding import GENESIS, canonical, hash_of, ids_step, sha256_hex
from .keys import AuditKeys, audit_keys
from .orphans import orphans


@dataclass
class _Walk:
    """Where a walk along the sealed chain stands: the last event checked and the running id digest."""

    macs_from: int | None  # from this seq on every event must carry a MAC (signed into checkpoints)
    prev_hash: str = GENESIS
    last_seq: int = 0
    count: int = 0
    ids: str = GENESIS
    mac_seen: bool = False

    def broken(self, ev: AuditEvent, valid: Callable[[AuditEvent], bool] | None) -> str | None:
        """Why ``ev`` (the next event in ``chain_seq`` order) breaks the chain, or None."""
        if ev.chain_seq != self.last_seq + 1 or ev.prev_hash != self.prev_hash:
            return "does not link to the previous event (an event was deleted or reordered)"
        if sha256_hex(canonical(ev.payload)) != ev.payload_digest:
            return "payload does not match payload_digest (edited)"
        if hash_of(ev, ev.chain_seq, ev.prev_hash) != ev.hash:
            return "hash does not match the event's fields (edited)"
        if ev.mac is None and self.macs_from is not None and ev.chain_seq >= self.macs_from:
            return (
                f"it has no MAC although every event from seq {self.macs_from} has one (signed checkpoint): "
                f"MACs were stripped or the row was forged"
            )
        if valid is not None and (ev.mac is not None or self.mac_seen) and not valid(ev):
            return "its MAC does not match: the service did not write this event (forged or edited)"
        return None

    def step(self, ev: AuditEvent) -> None:
        assert ev.hash is not None and ev.chain_seq is not None  # a sealed event, which broken() passed
        self.count += 1
        self.mac_seen = self.mac_seen or ev.mac is not None
        self.prev_hash, self.last_seq = ev.hash, ev.chain_seq
        self.ids = ids_step(self.ids, ev.chain_seq, ev.id)


def verify_chain(
    session: Session, batch: int = 5000, up_to: int | None = None, checkpoints: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Recompute the sealed chain in ``chain_seq`` order (up to ``up_to`` when given). Read-only: never seals.

    Checks every link and hash, every MAC (when the session's database has the service's keys; events sealed before
    MACs existed have none, which is accepted only before the first event that has one), and each of ``checkpoints``
    (verified claims ``{"last_seq", "events", "head", "ids_digest"?}``): the chain must reach its ``last_seq`` and
    have the same head and id digest there.

    ``{"ok": True, "events": N, "head": HASH, "last_seq": SEQ, "ids_digest": D, "pending": P, "macs": "checked" |
    "unchecked"}`` or ``{"ok": False, ...}`` with ``first_broken`` (``{"id", "seq", "kind", "reason"}``), ``forged``
    (unsealed rows the service did not write) or ``checkpoint`` (the checkpoint the chain no longer matches)."""
    keys = audit_keys(session)
    valid = keys.checker() if keys is not None else None
    want = {int(c["last_seq"]): c for c in checkpoints or []}
    froms = [int(c["macs_from"]) for c in checkpoints or [] if isinstance(c.get("macs_from"), int)]
    walk = _Walk(macs_from=min(froms) if froms else None)
    seen_at: dict[int, tuple[str, str]] = {}
    while True:
        q = (
            select(AuditEvent)
            .where(AuditEvent.chain_seq.is_not(None), AuditEvent.chain_seq > walk.last_seq)
            .order_by(AuditEvent.chain_seq)
            .limit(batch)
        )
        if up_to is not None:
            q = q.where(AuditEvent.chain_seq <= up_to)
        rows = session.execute(q).scalars().all()
        if not rows:
            break
        for ev in rows:
            reason = walk.broken(ev, valid)
            if reason:
                return {
                    "ok": False,
                    "events": walk.count + 1,
                    "first_broken": {"id": ev.id, "seq": ev.chain_seq, "kind": ev.kind, "reason": reason},
                }
            walk.step(ev)
            if walk.last_seq in want:
                seen_at[walk.last_seq] = (walk.prev_hash, walk.ids)
        session.expunge_all()
    out: dict[str, Any] = {
        "ok": True,
        "events": walk.count,
        "head": walk.prev_hash,
        "last_seq": walk.last_seq,
        "ids_digest": walk.ids,
        "macs": "checked" if keys is not None else "unchecked",
    }
    _compare_with_checkpoints(out, want, seen_at)
    if checkpoints:  # every copy the chain was compared with (stored, the data-dir file, a file passed)
        out["compared"] = [{"source": c.get("source"), "last_seq": c.get("last_seq")} for c in checkpoints]
    if up_to is None:
        _compare_with_head(session, out, keys)
        out.update(unsealed(session, keys))
        found = orphans(session)
        if found:  # rows written around the service, or whose event was dropped
            out["orphans"] = found
        if out.get("forged") or out.get("copies") or found:
            out["ok"] = False
    return out


def _compare_with_head(session: Session, out: dict[str, Any], keys: AuditKeys | None) -> None:
    """The chain's end against the recorded head (``audit_head``): a head above the end is a cut tail (``cut``, naming
    the first missing seq); a missing, unsigned-when-it-must-not-be, edited or lower head is ``head_record``."""
    trouble = head.problem(session, head.recorded(session), out["last_seq"], out["head"], keys)
    if trouble is None:
        return
    out["ok"] = False
    out["cut" if trouble.cut else "head_record"] = trouble.as_dict()


def _compare_with_checkpoints(
    out: dict[str, Any], want: dict[int, dict[str, Any]], seen_at: dict[int, tuple[str, str]]
) -> None:
    """The chain must reach each checkpoint's ``last_seq`` with the same head and id digest there: the newest one it
    no longer matches is reported (``out["ok"]`` false), else the newest one it matches."""
    for cp_seq in sorted(want, reverse=True):
        cp = want[cp_seq]
        problem = None
        if cp_seq not in seen_at:
            problem = (
                f"the chain ends at seq {out['last_seq']} but a checkpoint covers {cp_seq} events: events were "
                f"deleted (a cut tail or an emptied table)"
            )
        elif seen_at[cp_seq][0] != cp["head"]:
            problem = f"the chain's hash at seq {cp_seq} differs from the checkpoint's head: history was rewritten"
        elif cp.get("ids_digest") and seen_at[cp_seq][1] != cp["ids_digest"]:
            problem = f"the event ids up to seq {cp_seq} differ from the checkpoint's: ids were swapped or renumbered"
        if problem:
            out["ok"] = False
            out["checkpoint"] = {
                "last_seq": cp_seq,
                "events": cp.get("events"),
                "iat": cp.get("iat"),
                "source": cp.get("source"),
                "reason": problem,
            }
            return
    if want:
        newest = want[max(want)]
        out["checkpoint"] = {
            "last_seq": newest["last_seq"],
            "iat": newest.get("iat"),
            "source": newest.get("source"),
            "ok": True,
        }


STALE_UNSEALED_SECONDS = 60.0


def unsealed(session: Session, keys: AuditKeys | None, limit: int = 1000) -> dict[str, Any]:
    """Rows not in the chain: ``pending`` (written by the service, about to be sealed) and ``forged`` (the ids of
    rows without a valid MAC — never sealed; up to ``limit`` examined). Without the keys (a CLI away from the key
    directory) MACs cannot be checked: rows unsealed for over ``STALE_UNSEALED_SECONDS`` are reported as ``forged``
    instead (the service seals within seconds; only a service that has been down since would leave them)."""
    total = session.execute(select(func.count()).select_from(AuditEvent).where(AuditEvent.chain_seq.is_(None))).scalar()
    out: dict[str, Any] = {"pending": int(total or 0)}
    if not total:
        return out
    rows = (
        session.execute(select(AuditEvent).where(AuditEvent.chain_seq.is_(None)).order_by(AuditEvent.id).limit(limit))
        .scalars()
        .all()
    )
    if keys is not None:
        valid = keys.checker()
        forged = [ev.id for ev in rows if not valid(ev)]
    else:
        now = utcnow()
        forged = [
            ev.id
            for ev in rows
            if (now - (ev.ts if ev.ts.tzinfo else ev.ts.replace(tzinfo=dt.UTC))).total_seconds()
            > STALE_UNSEALED_SECONDS
        ]
    if forged:
        out["forged"] = forged
        out["pending"] -= len(forged)
    copies = [i for i in _copies(session, limit) if i not in set(forged)]
    if copies:
        out["copies"] = copies
        out["pending"] -= len(copies)
    return out


def _copies(session: Session, limit: int) -> list[int]:
    """Unsealed rows carrying the nonce of another row that is sealed or older: copies of an event (a valid MAC
    copied with it), which the sealer never seals. One anti-join over the nonce index."""
    other = aliased(AuditEvent)
    q = (
        select(AuditEvent.id)
        .where(
            AuditEvent.chain_seq.is_(None),
            AuditEvent.nonce.is_not(None),
            exists().where(
                other.nonce == AuditEvent.nonce,
                other.id != AuditEvent.id,
                or_(other.chain_seq.is_not(None), other.id < AuditEvent.id),
            ),
        )
        .order_by(AuditEvent.id)
        .limit(limit)
    )
    return list(session.execute(q).scalars())
