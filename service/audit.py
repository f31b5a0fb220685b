"""The tamper-evident audit log: an append-only hash chain over canonical JSON (RFC 8785, via ``rfc8785``), per-event
MACs, and signed checkpoints kept outside the database.

1. **append** — inside the caller's transaction, an event row is inserted with its ``payload_digest =
   sha256(JCS(payload))``, a ``mac`` (HMAC-SHA256 over the event's fields with a secret derived from the service's
   signing keys, ``AuditKeys``) and no chain position yet. It commits or rolls back with the state change it records.
2. **seal** — a sealer takes the chain lock (``pg_advisory_xact_lock`` on PostgreSQL, which every replica and worker
   shares; SQLite has a single writer), reads the chain head and gives every committed, unsealed event whose MAC is
   valid, in insertion order, the next ``chain_seq``, ``prev_hash`` and ``hash = sha256(JCS({"seq", "prev_hash", "ts",
   "actor", "kind", "subject", "node", "plan_id", "model", "payload_digest"}))``. The first event's ``prev_hash`` is 64
   zeros. A row the service did not write (no valid MAC) is never sealed. In the service a background thread per
   process seals a burst of writes as one batch moments after they commit (``Sealer``); the CLI seals at once.
3. **checkpoint** — every ``PREFLIGHT_AUDIT_CHECKPOINT_EVENTS`` events or ``PREFLIGHT_AUDIT_CHECKPOINT_SECONDS`` after
   the chain grew, the sealer signs the chain's length, head hash and a digest of the event ids in chain order with
   the service key (RFC 6962's signed tree head), stores it (``audit_checkpoints``) and writes it to a file in the data
   dir; ``GET /v1/audit/checkpoints/latest`` serves it to agents and auditors, who keep copies.

Verification is read-only (it never seals): it recomputes every sealed event in ``chain_seq`` order — an edit,
deletion or reordering breaks a link and is reported with the event's id —, checks every MAC, reports unsealed rows
(``pending``; a forged one as ``forged``), and compares the chain with the newest checkpoint it can find (database,
data-dir file, a file an auditor saved): a deleted tail, an emptied table or swapped ids no longer match it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import hmac
import logging
import os
import pathlib
import threading
import time
from typing import Any

import rfc8785
from sqlalchemy import bindparam, func, insert, select, text, update
from sqlalchemy.orm import Session

from . import metrics
from .db.models import AuditCheckpoint, AuditEvent, utcnow
from .signing import CHECKPOINT_MEDIA_TYPE

GENESIS = "0" * 64
_ADVISORY_KEY = 0x5052454654  # "PREFT"
SEAL_BATCH = 2000
SEAL_INTERVAL = 0.05  # how long a woken sealer lets writes gather before sealing them
SWEEP_INTERVAL = 2.0  # how often an idle sealer looks for events other processes left unsealed
log = logging.getLogger("preflight.audit")


_SAFE_INT = 1 << 53


def _flat(obj: Any) -> bool:
    """A dict of ASCII keys whose values are str, None, bool or safe integers: the shape of every hashed and MAC'd
    audit field set. For it, sorted compact JSON without ASCII escaping is byte for byte RFC 8785 (keys are ASCII so
    code-point order is UTF-16 order; strings escape '"', '\\' and control characters alike, lower-case hex)."""
    if type(obj) is not dict:
        return False
    for k, v in obj.items():
        if type(k) is not str or not k.isascii():
            return False
        t = type(v)
        if t is str or v is None or t is bool:
            continue
        if t is int and -_SAFE_INT < v < _SAFE_INT:
            continue
        return False
    return True


def canonical(obj: Any) -> bytes:
    """RFC 8785 canonical JSON (rfc8785); flat field sets take an equivalent fast path (tests/test_audit_chain.py
    checks the two agree)."""
    if _flat(obj):
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return rfc8785.dumps(obj)


_RECORD_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False)


def _record(keys: tuple[str, ...], values: tuple) -> bytes:
    """``canonical(dict(zip(keys, values)))`` for a fixed field set whose ``keys`` are ASCII and listed in sorted
    order (RFC 8785's order for ASCII keys): the event hash and MAC inputs, computed several times per event, without
    the generic shape check and sort. Values other than str, null and safe integers take the generic path.
    tests/test_audit_chain.py checks it against rfc8785."""
    for v in values:
        t = type(v)
        if not (t is str or v is None or (t is int and -_SAFE_INT < v < _SAFE_INT)):
            return canonical(dict(zip(keys, values)))
    return _RECORD_ENCODER.encode(dict(zip(keys, values))).encode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _ts(value: dt.datetime) -> str:
    tz = value.tzinfo
    if tz is None:  # SQLite hands back naive UTC
        return value.isoformat(timespec="microseconds") + "+00:00"
    if tz is not dt.timezone.utc:
        value = value.astimezone(dt.timezone.utc)
    return value.isoformat(timespec="microseconds")


def event_hash(seq: int, prev_hash: str, ts: dt.datetime, actor: str, kind: str, subject: str, node: str | None,
               plan_id: str | None, model: str | None, payload_digest: str) -> str:
    return sha256_hex(_record(_HASH_KEYS, (actor, kind, model, node, payload_digest, plan_id, prev_hash, seq, subject,
                                           _ts(ts))))


_HASH_KEYS = ("actor", "kind", "model", "node", "payload_digest", "plan_id", "prev_hash", "seq", "subject", "ts")
_MAC_KEYS = ("actor", "kind", "model", "node", "payload_digest", "plan_id", "subject", "ts")
_SEALED_KEYS = ("actor", "hash", "id", "kind", "model", "node", "payload_digest", "plan_id", "prev_hash", "seq",
                "subject", "ts")


def _hash_of(ev: AuditEvent, seq: int, prev_hash: str) -> str:
    return event_hash(seq, prev_hash, ev.ts, ev.actor, ev.kind, ev.subject, ev.node, ev.plan_id, ev.model,
                      ev.payload_digest)


def _mac_fields(ts: dt.datetime, actor: str, kind: str, subject: str, node: str | None, plan_id: str | None,
                model: str | None, payload_digest: str) -> bytes:
    return _record(_MAC_KEYS, (actor, kind, model, node, payload_digest, plan_id, subject, _ts(ts)))


def _sealed_fields(ev: AuditEvent, seq: int, prev_hash: str | None, h: str | None) -> bytes:
    return _record(_SEALED_KEYS, (ev.actor, h, ev.id, ev.kind, ev.model, ev.node, ev.payload_digest, ev.plan_id,
                                  prev_hash, seq, ev.subject, _ts(ev.ts)))


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
            return f"s1.{kid}.{hmac.new(secret, _sealed_fields(ev, seq, prev_hash, h), hashlib.sha256).hexdigest()}"
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
                fields = _sealed_fields(ev, ev.chain_seq, ev.prev_hash, ev.hash)
            else:
                secret = secrets.get(head)
                fields = _mac_fields(ev.ts, ev.actor, ev.kind, ev.subject, ev.node, ev.plan_id, ev.model,
                                     ev.payload_digest)
            return secret is not None and hmac.compare_digest(digest,
                                                              hmac.new(secret, fields, hashlib.sha256).hexdigest())
        return check

    def event_valid(self, ev: AuditEvent) -> bool:
        return self.checker()(ev)


def audit_keys(session: Session) -> AuditKeys | None:
    """The MAC keys of the Database the session belongs to (None: a database used without the service's keys)."""
    db = session.info.get("database")
    return getattr(db, "audit_keys", None)


def append(session: Session, *, actor: str, kind: str, subject: str, payload: dict[str, Any],
           node: str | None = None, plan_id: str | None = None, model: str | None = None) -> None:
    """Record one event inside the caller's transaction (sealed into the chain after it commits). A plain INSERT:
    no lock, no read of the chain head."""
    append_many(session, [dict(actor=actor, kind=kind, subject=subject, payload=payload, node=node, plan_id=plan_id,
                               model=model)])


def append_many(session: Session, events: list[dict[str, Any]]) -> None:
    """Record several events (dicts with ``append``'s keyword arguments) in one INSERT, in list order — the agents'
    batched writes (services/agent_writes.py)."""
    if not events:
        return
    now = utcnow()
    rows = [{"ts": now, "node": None, "plan_id": None, "model": None, **ev,
             "payload_digest": sha256_hex(canonical(ev["payload"]))} for ev in events]
    keys = audit_keys(session)
    sign = keys.signer() if keys is not None else None
    for row in rows:
        row["mac"] = sign(_mac_fields(row["ts"], row["actor"], row["kind"], row["subject"], row["node"],
                                      row["plan_id"], row["model"], row["payload_digest"])) if sign else None
    session.execute(insert(AuditEvent.__table__), rows)
    session.info["audit_appended"] = True
    for ev in events:
        metrics.AUDIT_APPENDS.labels(ev["kind"]).inc()


def _lock(session: Session, *, wait: bool) -> bool:
    if session.get_bind().dialect.name != "postgresql":
        return True  # SQLite: the transaction already holds the database's only write lock (BEGIN IMMEDIATE)
    if wait:
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_KEY})
        return True
    return bool(session.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _ADVISORY_KEY}).scalar())


_REFUSED: set[int] = set()  # ids of rows the sealer refused (no valid MAC), to log each once


def seal(session: Session, *, wait: bool = True, batch: int = SEAL_BATCH) -> int:
    """Chain the committed, unsealed events (in id order) under the chain lock; returns how many were sealed.
    With ``wait=False`` it returns 0 at once when another sealer holds the lock. When the database has the service's
    keys, a row without a valid MAC (not written by the service) is left unsealed — verify reports it as forged."""
    if not _lock(session, wait=wait):
        return 0
    keys = audit_keys(session)
    valid = keys.checker() if keys is not None else None
    seal_mac = keys.seal_signer() if keys is not None else None
    head = session.execute(select(AuditEvent.chain_seq, AuditEvent.hash).where(AuditEvent.chain_seq.is_not(None))
                           .order_by(AuditEvent.chain_seq.desc()).limit(1)).first()
    seq, prev = (head[0], head[1]) if head else (0, GENESIS)
    session.info["chain_head_seq"] = seq
    total = 0
    cursor = 0
    table = AuditEvent.__table__
    while True:
        # Core rows (attribute access like the ORM's, without an identity map or instance state per event)
        pending = session.execute(select(table).where(table.c.chain_seq.is_(None), table.c.id > cursor)
                                  .order_by(table.c.id).limit(batch)).all()
        if not pending:
            return total
        cursor = pending[-1].id
        full = len(pending) == batch
        rows = []
        for ev in pending:
            if valid is not None and not valid(ev):
                if ev.id not in _REFUSED:  # logged once per process, not on every pass
                    if len(_REFUSED) > 10_000:
                        _REFUSED.clear()
                    _REFUSED.add(ev.id)
                    log.error("audit: event %s has no valid MAC (not written by the service): left unsealed", ev.id)
                continue
            seq += 1
            h = _hash_of(ev, seq, prev)
            rows.append({"_id": ev.id, "chain_seq": seq, "prev_hash": prev, "hash": h,
                         "mac": seal_mac(ev, seq, prev, h) if seal_mac is not None else ev.mac})
            prev = h
        if rows:
            session.connection().execute(update(table).where(table.c.id == bindparam("_id"))
                                         .values(chain_seq=bindparam("chain_seq"), prev_hash=bindparam("prev_hash"),
                                                 hash=bindparam("hash"), mac=bindparam("mac")), rows)
        total += len(rows)
        session.info["chain_head_seq"] = seq
        if not full:
            return total


class Sealer:
    """Per-process sealing. In a service process (``background = True``) writers only signal a background thread,
    which seals what is pending at most ``SEAL_INTERVAL`` seconds later — one lock and one transaction per batch,
    none in the request path. Elsewhere (CLI, tests) ``seal_soon`` seals at once. The thread also sweeps every few
    seconds for events written by other processes that exited before sealing. With a ``checkpointer`` (the service)
    each pass also makes a signed checkpoint when one is due."""

    def __init__(self, db):
        self.db = db
        self.background = False
        self.checkpointer: Checkpointer | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.high_water = 0  # the longest chain this process has sealed onto: a shorter one later means a cut tail
        self._passes = 0
        self._running = False  # a pass is between its read of the pending rows and its commit
        self._passed = threading.Condition()

    def seal_now(self, *, wait: bool = True) -> int:
        made = None
        with self.db.sessions() as s:
            with s.begin():
                n = seal(s, wait=wait)
                if self.checkpointer is not None:
                    made = self.checkpointer.maybe(s)
            self.high_water = max(self.high_water, s.info.get("chain_head_seq", 0))
        if made is not None:
            self.checkpointer.publish(made)  # the file outside the database, once the checkpoint is committed
        return n

    def seal_soon(self) -> None:
        if self.background:
            self._wake.set()
            return
        try:
            self.seal_now(wait=True)
        except Exception as exc:  # never fail the write that already committed; the next seal picks it up
            log.warning("audit seal deferred: %s", exc.__class__.__name__)

    def flush(self, timeout: float = 2.0) -> None:
        """Wait (at most ``timeout`` seconds) until the background thread has completed a pass started after this
        call — what was committed before it is then sealed (if its MAC is valid). No-op without the thread."""
        if not self.background or self._thread is None:
            return
        with self._passed:
            # a pass already running may have read the pending rows before our call: wait for the one after it
            target = self._passes + (2 if self._running else 1)
            self._wake.set()
            self._passed.wait_for(lambda: self._passes >= target or not self.background, timeout)

    def start(self) -> None:
        self.background = True
        self._stop.clear()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="audit-sealer", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread after a last seal (nothing committed stays unsealed because of a shutdown)."""
        self.background = False
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while True:
            woken = self._wake.wait(SWEEP_INTERVAL)
            if woken and not self._stop.is_set():
                self._stop.wait(SEAL_INTERVAL)  # let a burst of writes gather into one batch
            with self._passed:
                self._wake.clear()
                self._running = True
            try:
                self.seal_now(wait=True)
            except Exception as exc:  # database down: keep trying
                log.warning("audit sealer: %s", exc.__class__.__name__)
            with self._passed:
                self._running = False
                self._passes += 1
                self._passed.notify_all()
            if self._stop.is_set():
                return


def _ids_step(digest: str, seq: int, event_id: int) -> str:
    """The running digest of event ids in chain order (a swap of two events' ids changes it)."""
    return sha256_hex(f"{digest}:{seq}:{event_id}".encode())


def verify_chain(session: Session, batch: int = 5000, up_to: int | None = None,
                 checkpoints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
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
    seen_at: dict[int, tuple[str, str]] = {}
    prev_hash, count, last_seq, expected_seq, ids = GENESIS, 0, 0, 1, GENESIS
    mac_seen = False
    # from this seq on every event must carry a MAC (signed into checkpoints: stripping MACs does not pass)
    froms = [int(c["macs_from"]) for c in checkpoints or [] if isinstance(c.get("macs_from"), int)]
    macs_from = min(froms) if froms else None
    while True:
        q = (select(AuditEvent).where(AuditEvent.chain_seq.is_not(None), AuditEvent.chain_seq > last_seq)
             .order_by(AuditEvent.chain_seq).limit(batch))
        if up_to is not None:
            q = q.where(AuditEvent.chain_seq <= up_to)
        rows = session.execute(q).scalars().all()
        if not rows:
            break
        for ev in rows:
            count += 1
            reason = None
            if ev.chain_seq != expected_seq or ev.prev_hash != prev_hash:
                reason = "does not link to the previous event (an event was deleted or reordered)"
            elif sha256_hex(canonical(ev.payload)) != ev.payload_digest:
                reason = "payload does not match payload_digest (edited)"
            elif _hash_of(ev, ev.chain_seq, ev.prev_hash) != ev.hash:
                reason = "hash does not match the event's fields (edited)"
            elif ev.mac is None and macs_from is not None and ev.chain_seq >= macs_from:
                reason = (f"it has no MAC although every event from seq {macs_from} has one (signed checkpoint): "
                          f"MACs were stripped or the row was forged")
            elif valid is not None and (ev.mac is not None or mac_seen) and not valid(ev):
                reason = "its MAC does not match: the service did not write this event (forged or edited)"
            if reason:
                return {"ok": False, "events": count,
                        "first_broken": {"id": ev.id, "seq": ev.chain_seq, "kind": ev.kind, "reason": reason}}
            mac_seen = mac_seen or ev.mac is not None
            prev_hash, last_seq, expected_seq = ev.hash, ev.chain_seq, ev.chain_seq + 1
            ids = _ids_step(ids, ev.chain_seq, ev.id)
            if last_seq in want:
                seen_at[last_seq] = (prev_hash, ids)
        session.expunge_all()
    out: dict[str, Any] = {"ok": True, "events": count, "head": prev_hash, "last_seq": last_seq, "ids_digest": ids,
                           "macs": "checked" if keys is not None else "unchecked"}
    for cp_seq in sorted(want, reverse=True):
        cp = want[cp_seq]
        problem = None
        if cp_seq not in seen_at:
            problem = (f"the chain ends at seq {last_seq} but a checkpoint covers {cp_seq} events: events were "
                       f"deleted (a cut tail or an emptied table)")
        elif seen_at[cp_seq][0] != cp["head"]:
            problem = f"the chain's hash at seq {cp_seq} differs from the checkpoint's head: history was rewritten"
        elif cp.get("ids_digest") and seen_at[cp_seq][1] != cp["ids_digest"]:
            problem = f"the event ids up to seq {cp_seq} differ from the checkpoint's: ids were swapped or renumbered"
        if problem:
            out["ok"] = False
            out["checkpoint"] = {"last_seq": cp_seq, "events": cp.get("events"), "iat": cp.get("iat"),
                                 "source": cp.get("source"), "reason": problem}
            break
    if want and "checkpoint" not in out:
        newest = want[max(want)]
        out["checkpoint"] = {"last_seq": newest["last_seq"], "iat": newest.get("iat"), "source": newest.get("source"),
                             "ok": True}
    if checkpoints:  # every copy the chain was compared with (stored, the data-dir file, a file passed)
        out["compared"] = [{"source": c.get("source"), "last_seq": c.get("last_seq")} for c in checkpoints]
    if up_to is None:
        out.update(unsealed(session, keys))
        if out.get("forged"):
            out["ok"] = False
    return out


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
    rows = session.execute(select(AuditEvent).where(AuditEvent.chain_seq.is_(None)).order_by(AuditEvent.id)
                           .limit(limit)).scalars().all()
    if keys is not None:
        valid = keys.checker()
        forged = [ev.id for ev in rows if not valid(ev)]
    else:
        now = utcnow()
        forged = [ev.id for ev in rows
                  if (now - (ev.ts if ev.ts.tzinfo else ev.ts.replace(tzinfo=dt.timezone.utc))).total_seconds()
                  > STALE_UNSEALED_SECONDS]
    if forged:
        out["forged"] = forged
        out["pending"] -= len(forged)
    return out


def event_dict(ev: AuditEvent) -> dict[str, Any]:
    return {
        "id": ev.id, "seq": ev.chain_seq, "ts": _ts(ev.ts), "actor": ev.actor, "kind": ev.kind,
        "subject": ev.subject, "node": ev.node, "plan_id": ev.plan_id, "model": ev.model, "payload": ev.payload,
        "payload_digest": ev.payload_digest, "prev_hash": ev.prev_hash, "hash": ev.hash,
    }


CHECKPOINT_TYPE = CHECKPOINT_MEDIA_TYPE


def checkpoint_claims(session: Session, issuer: str) -> dict[str, Any]:
    """The sealed chain's head as of now (read under the chain lock by callers that store it), to be signed with the
    service key: ``{"iss", "iat", "typ", "events", "last_seq", "head", "ids_digest"}``. Raises ValueError when the
    chain is broken (a checkpoint never vouches for one)."""
    out = verify_chain(session, up_to=None)
    if not out["ok"] and "first_broken" in out:
        raise ValueError(f"audit chain broken at event {out['first_broken']['id']}: {out['first_broken']['reason']}")
    return {"iss": issuer, "iat": int(utcnow().timestamp()), "events": out["events"], "last_seq": out["last_seq"],
            "head": out["head"], "ids_digest": out["ids_digest"], "typ": "audit-checkpoint"}


def check_checkpoint(session: Session, claims: dict[str, Any]) -> dict[str, Any]:
    """Recompute a (signature-verified) checkpoint against this database: the chain up to ``last_seq`` must be
    intact, hold the same number of events, end in the same head hash and (newer checkpoints) the same ids."""
    out = verify_chain(session, up_to=int(claims["last_seq"]))
    if not out["ok"]:
        return {"ok": False, "reason": "chain broken", "first_broken": out["first_broken"]}
    if out["events"] != claims["events"] or out["head"] != claims["head"] or (
            claims.get("ids_digest") and out["ids_digest"] != claims["ids_digest"]):
        return {"ok": False, "reason": "the chain up to the checkpoint differs (events deleted, inserted, edited or "
                                       "renumbered)",
                "expected": {"events": claims["events"], "head": claims["head"]},
                "found": {"events": out["events"], "head": out["head"]}}
    return {"ok": True, "events": out["events"], "head": out["head"], "last_seq": out["last_seq"]}


class Checkpointer:
    """Signed checkpoints made by the sealer: one when ``every_events`` events were sealed since the newest, or when
    the chain grew and ``every_seconds`` passed. Each is stored (``audit_checkpoints``) and written to ``path`` (the
    data dir: a copy the database cannot take back). The id digest continues from the newest checkpoint whose
    signature verifies, so a checkpoint costs the events since the last one, not the whole chain."""

    def __init__(self, keys, issuer: str, path: pathlib.Path, *, every_events: int, every_seconds: float):
        self.keys, self.issuer, self.path = keys, issuer, pathlib.Path(path)
        self.every_events, self.every_seconds = every_events, every_seconds

    def _verified(self, signed: str) -> dict[str, Any] | None:
        from .agent.verify import VerificationError, verify_jws

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
            created = newest.created_at if newest.created_at.tzinfo else newest.created_at.replace(tzinfo=dt.timezone.utc)
            if (utcnow() - created).total_seconds() < self.every_seconds:
                return None
        try:
            with session.begin_nested():  # a refused checkpoint leaves the seal it rides on intact
                return self.make(session, newest)
        except ValueError as exc:
            now = time.monotonic()
            if now - getattr(self, "_warned", 0.0) > 60:
                self._warned = now
                log.error("audit checkpoint refused: %s (sealing goes on; verify reports the break)", exc)
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
            table = AuditEvent.__table__
            rows = session.execute(select(table).where(table.c.chain_seq > seq)
                                   .order_by(table.c.chain_seq).limit(2000)).all()
            if not rows:
                break
            for ev in rows:
                if ev.chain_seq != seq + 1 or ev.prev_hash != prev:
                    raise ValueError(f"audit chain broken at event {ev.id}: does not link to the previous event")
                if sha256_hex(canonical(ev.payload)) != ev.payload_digest or _hash_of(ev, ev.chain_seq,
                                                                                      ev.prev_hash) != ev.hash:
                    raise ValueError(f"audit chain broken at event {ev.id}: its hash does not match its fields")
                if ev.mac is None:
                    if macs_from is not None and ev.chain_seq >= macs_from:
                        raise ValueError(f"audit event {ev.id} has no MAC after MACs began (seq {macs_from})")
                    last_without_mac = ev.chain_seq
                elif valid is not None and not valid(ev):
                    raise ValueError(f"audit event {ev.id}: its MAC does not match (not written by the service)")
                seq, prev, ids, count = ev.chain_seq, ev.hash, _ids_step(ids, ev.chain_seq, ev.id), count + 1
                if on_file is not None and seq == int(on_file.get("last_seq", -1)) and (
                        prev != on_file.get("head") or (on_file.get("ids_digest") and ids != on_file["ids_digest"])):
                    raise ValueError(f"the audit chain at seq {seq} differs from the data-dir checkpoint: history "
                                     f"was rewritten")
        if count == 0 or (newest is not None and newest.last_seq >= seq):
            return None
        if on_file is not None and int(on_file.get("last_seq", 0)) > seq:
            raise ValueError(f"the data-dir checkpoint covers {on_file['last_seq']} events but the chain ends at {seq}")
        if macs_from is None:
            macs_from = (last_without_mac or 0) + 1
        claims = {"iss": self.issuer, "iat": int(time.time()), "typ": "audit-checkpoint", "events": count,
                  "last_seq": seq, "head": prev, "ids_digest": ids, "macs_from": macs_from}
        row = AuditCheckpoint(last_seq=seq, events=count, head=prev, ids_digest=ids, kid=self.keys.active_kid,
                              signed=self.keys.sign(claims, typ=CHECKPOINT_TYPE))
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
    from .agent.verify import VerificationError, verify_jws

    try:
        signed = pathlib.Path(path).read_text().strip()
    except FileNotFoundError:
        return None
    try:
        claims, _ = verify_jws(signed, jwks, typ=CHECKPOINT_TYPE)
    except VerificationError as exc:
        raise ValueError(f"checkpoint {path} does not verify: {exc}") from None
    return claims


def known_checkpoints(session: Session, jwks: dict, files: list[pathlib.Path] = ()) -> tuple[list[dict], list[str]]:
    """The checkpoints verify compares the chain with: the newest stored one whose signature verifies, and each file
    given (the data-dir copy, one an auditor saved). Returns (claims with a ``source``, problems)."""
    from .agent.verify import VerificationError, verify_jws

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
            claims = read_checkpoint_file(f, jwks)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if claims is not None:
            found.append({**claims, "source": str(f)})
    return found, problems
