"""How audit events are written down: canonical JSON (RFC 8785), the event hash, the fields a MAC covers, and the
running digest of event ids that checkpoints sign."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Any, Protocol

import rfc8785

from ..db.models import AuditEvent

GENESIS = "0" * 64


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
    """RFC 8785 canonical JSON (rfc8785); flat field sets take an equivalent fast path (tests/audit/test_chain.py
    checks the two agree)."""
    if _flat(obj):
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return rfc8785.dumps(obj)


_RECORD_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False)


def _record(keys: tuple[str, ...], values: tuple) -> bytes:
    """``canonical(dict(zip(keys, values)))`` for a fixed field set whose ``keys`` are ASCII and listed in sorted
    order (RFC 8785's order for ASCII keys): the event hash and MAC inputs, computed several times per event, without
    the generic shape check and sort. Values other than str, null and safe integers take the generic path.
    tests/audit/test_chain.py checks it against rfc8785."""
    for v in values:
        t = type(v)
        if not (t is str or v is None or (t is int and -_SAFE_INT < v < _SAFE_INT)):
            return canonical(dict(zip(keys, values)))
    return _RECORD_ENCODER.encode(dict(zip(keys, values))).encode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ts_text(value: dt.datetime) -> str:
    """An event time as hashed: ISO 8601 in UTC with microseconds."""
    tz = value.tzinfo
    if tz is None:  # SQLite hands back naive UTC
        return value.isoformat(timespec="microseconds") + "+00:00"
    if tz is not dt.UTC:
        value = value.astimezone(dt.UTC)
    return value.isoformat(timespec="microseconds")


def event_hash(
    seq: int,
    prev_hash: str,
    ts: dt.datetime,
    actor: str,
    kind: str,
    subject: str,
    node: str | None,
    plan_id: str | None,
    model: str | None,
    payload_digest: str,
) -> str:
    return sha256_hex(
        _record(_HASH_KEYS, (actor, kind, model, node, payload_digest, plan_id, prev_hash, seq, subject, ts_text(ts)))
    )


_HASH_KEYS = ("actor", "kind", "model", "node", "payload_digest", "plan_id", "prev_hash", "seq", "subject", "ts")
_MAC_KEYS = ("actor", "kind", "model", "node", "payload_digest", "plan_id", "subject", "ts")
# the MAC forms that bind a per-event nonce (keys.py ``a2.``/``s2.``): a copy of a row is then recognisably a copy
_MAC_NONCE_KEYS = ("actor", "kind", "model", "node", "nonce", "payload_digest", "plan_id", "subject", "ts")
_SEALED_KEYS = (
    "actor",
    "hash",
    "id",
    "kind",
    "model",
    "node",
    "payload_digest",
    "plan_id",
    "prev_hash",
    "seq",
    "subject",
    "ts",
)
_SEALED_NONCE_KEYS = tuple(sorted((*_SEALED_KEYS, "nonce")))


class HashedFields(Protocol):
    """What an event's hash covers besides its place in the chain: an AuditEvent, or a Core row of its table (the
    sealing and the checkpointer read rows without the ORM)."""

    @property
    def ts(self) -> dt.datetime: ...
    @property
    def actor(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def subject(self) -> str: ...
    @property
    def node(self) -> str | None: ...
    @property
    def plan_id(self) -> str | None: ...
    @property
    def model(self) -> str | None: ...
    @property
    def payload_digest(self) -> str: ...


def hash_of(ev: HashedFields, seq: int, prev_hash: str) -> str:
    return event_hash(
        seq, prev_hash, ev.ts, ev.actor, ev.kind, ev.subject, ev.node, ev.plan_id, ev.model, ev.payload_digest
    )


def mac_fields(
    ts: dt.datetime,
    actor: str,
    kind: str,
    subject: str,
    node: str | None,
    plan_id: str | None,
    model: str | None,
    payload_digest: str,
    nonce: str | None = None,
) -> bytes:
    """What an append MAC covers: the event's fields, and its nonce (the ``a2.`` form) when it has one."""
    if nonce is not None:
        return _record(
            _MAC_NONCE_KEYS, (actor, kind, model, node, nonce, payload_digest, plan_id, subject, ts_text(ts))
        )
    return _record(_MAC_KEYS, (actor, kind, model, node, payload_digest, plan_id, subject, ts_text(ts)))


def sealed_fields(ev: AuditEvent, seq: int, prev_hash: str | None, h: str | None, *, nonce: bool = False) -> bytes:
    """What a sealed MAC covers: the event's fields, id and place in the chain, and (``nonce``: the ``s2.`` form)
    its nonce."""
    if nonce:
        return _record(
            _SEALED_NONCE_KEYS,
            (
                ev.actor,
                h,
                ev.id,
                ev.kind,
                ev.model,
                ev.node,
                ev.nonce,
                ev.payload_digest,
                ev.plan_id,
                prev_hash,
                seq,
                ev.subject,
                ts_text(ev.ts),
            ),
        )
    return _record(
        _SEALED_KEYS,
        (
            ev.actor,
            h,
            ev.id,
            ev.kind,
            ev.model,
            ev.node,
            ev.payload_digest,
            ev.plan_id,
            prev_hash,
            seq,
            ev.subject,
            ts_text(ev.ts),
        ),
    )


def head_fields(seq: int, h: str) -> bytes:
    """What the recorded head's MAC covers (``typ`` keeps it apart from every event field set)."""
    return _record(("hash", "seq", "typ"), (h, seq, "audit-head"))


def ids_step(digest: str, seq: int, event_id: int) -> str:
    """The running digest of event ids in chain order (a swap of two events' ids changes it)."""
    return sha256_hex(f"{digest}:{seq}:{event_id}".encode())
