"""The recorded head (``audit_head``, one row): the chain's last sealed seq and hash, written with a MAC by the very
transaction that seals, under the chain lock. The chain's end is compared with it by the sealer before every seal,
by each service process at start-up and by verify, so a deleted tail shows to every process, after a restart, and
to the CLI — not only to the process that sealed the deleted events."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session

from ..db.models import AuditEvent, AuditHead, table_of, utcnow
from .keys import AuditKeys


@dataclass(frozen=True)
class HeadProblem:
    """Why the chain's end and the recorded head disagree. ``cut``: sealed events past the chain's end are gone
    (``first_missing`` is the first seq missing)."""

    reason: str
    head_seq: int | None
    last_seq: int
    cut: bool = False

    def as_dict(self) -> dict:
        out: dict = {"head_seq": self.head_seq, "last_seq": self.last_seq, "reason": self.reason}
        if self.cut:
            out["first_missing"] = self.last_seq + 1
        return out


def recorded(session: Session) -> AuditHead | None:
    return session.execute(select(AuditHead).where(AuditHead.id == 1)).scalar_one_or_none()


def _nonce_macs_sealed(session: Session) -> bool:
    """Has any event been sealed in the ``s2.`` form, i.e. by a sealer that also signs the head? Only asked while
    the head is unsigned (the state migration 0015 leaves until the first seal)."""
    return bool(
        session.execute(select(exists().where(AuditEvent.chain_seq.is_not(None), AuditEvent.mac.like("s2.%")))).scalar()
    )


def problem(
    session: Session, head: AuditHead | None, last_seq: int, last_hash: str, keys: AuditKeys | None
) -> HeadProblem | None:
    """How the sealed chain, ending at ``(last_seq, last_hash)``, disagrees with the recorded ``head``, or None.

    The row must exist (migration 0015 writes it); carry a valid MAC when the keys are at hand (an unsigned row is
    accepted only while no event was sealed by a sealer that signs heads, i.e. straight after the migration); and
    name exactly the chain's end. A head above the end is a cut tail; one below means rows were chained outside
    the sealer or the head was lowered by hand."""
    if head is None:
        return HeadProblem(
            f"the recorded head (audit_head) is missing while the chain ends at seq {last_seq}: it was deleted",
            None,
            last_seq,
        )
    if keys is not None:
        if head.mac is None:
            if _nonce_macs_sealed(session):
                return HeadProblem(
                    "the recorded head carries no MAC although events were sealed by a sealer that signs it: the "
                    "head was replaced by hand",
                    head.seq,
                    last_seq,
                )
        elif not keys.head_valid(head.seq, head.hash, head.mac):
            return HeadProblem(
                "the recorded head's MAC does not match: the head was edited by hand", head.seq, last_seq
            )
    if head.seq > last_seq:
        return HeadProblem(
            f"the chain ends at seq {last_seq} but the recorded head is seq {head.seq}: events "
            f"{last_seq + 1}..{head.seq} were deleted (a cut tail)",
            head.seq,
            last_seq,
            cut=True,
        )
    if head.seq < last_seq:
        return HeadProblem(
            f"the chain goes on to seq {last_seq} past the recorded head at seq {head.seq}: events were chained "
            f"outside the sealer, or the head was put back",
            head.seq,
            last_seq,
        )
    if head.hash != last_hash:
        return HeadProblem(
            f"the chain's hash at seq {last_seq} differs from the recorded head's: history was rewritten",
            head.seq,
            last_seq,
        )
    return None


def record(session: Session, seq: int, h: str, keys: AuditKeys | None) -> None:
    """Move the recorded head to ``(seq, h)`` — in the sealing transaction, under the chain lock."""
    session.connection().execute(
        update(table_of(AuditHead))
        .where(table_of(AuditHead).c.id == 1)
        .values(seq=seq, hash=h, mac=keys.head_mac(seq, h) if keys is not None else None, updated_at=utcnow())
    )
