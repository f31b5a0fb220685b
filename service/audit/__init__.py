"""The tamper-evident audit log: an append-only hash chain over canonical JSON (RFC 8785, via ``rfc8785``), per-event
MACs, and signed checkpoints kept outside the database.

1. **append** — inside the caller's transaction, an event row is inserted with its ``payload_digest =
   sha256(JCS(payload))``, a random ``nonce`` and a ``mac`` (HMAC-SHA256 over the event's fields and nonce with a
   secret derived from the service's signing keys, ``AuditKeys``) and no chain position yet. It commits or rolls back
   with the state change it records. A plain INSERT: no lock, no read of the chain.
2. **seal** — a sealer takes the chain lock (``pg_advisory_xact_lock`` on PostgreSQL, which every replica and worker
   shares; SQLite has a single writer), reads the chain head, checks it against the **recorded head** (``audit_head``,
   ``head.py``) and gives every committed, unsealed event whose MAC is valid and whose nonce no other row had first,
   in insertion order, the next ``chain_seq``, ``prev_hash`` and ``hash = sha256(JCS({"seq", "prev_hash", "ts",
   "actor", "kind", "subject", "node", "plan_id", "model", "payload_digest"}))``, replaces the MAC by one that also
   binds the row's id and place, and moves the recorded head (seq, hash, MAC) — all in one transaction. The first
   event's ``prev_hash`` is 64 zeros. A row the service did not write (no valid MAC) or a copy of one (its nonce seen
   before) is never sealed; nothing is sealed while the chain's end disagrees with the recorded head (a cut tail:
   sealing on would hide it). In the service a background thread per process seals a burst of writes as one batch
   moments after they commit (``Sealer``; it also compares the head at start-up); the CLI seals at once.
3. **checkpoint** — every ``PREFLIGHT_AUDIT_CHECKPOINT_EVENTS`` events or ``PREFLIGHT_AUDIT_CHECKPOINT_SECONDS`` after
   the chain grew, the sealer signs the chain's length, head hash and a digest of the event ids in chain order with
   the service key (RFC 6962's signed tree head), stores it (``audit_checkpoints``) and writes it to a file in the data
   dir; ``GET /v1/audit/checkpoints/latest`` serves it to agents and auditors, who keep copies.

Verification is read-only (it never seals): it recomputes every sealed event in ``chain_seq`` order — an edit,
deletion or reordering breaks a link and is reported with the event's id —, checks every MAC, reports unsealed rows
(``pending``; a forged one as ``forged``, a copy as ``copies``), compares the chain's end with the recorded head (a
deleted tail since the newest checkpoint: ``cut`` naming the first missing seq; the head row deleted or edited:
``head_record``) and the chain with the newest checkpoint it can find (database, data-dir file, a file an auditor
saved): a deleted tail, an emptied table or swapped ids no longer match it. Last, it checks state against the chain
(``orphans.py``): every token, plan, assignment and rollout row must have the event that created it.

MAC forms: ``a2.``/``s2.`` (append/sealed, with the nonce); rows written before migration 0015 keep ``<kid>.``/``s1.``
(no nonce), which still verify. The recorded head's MAC is ``h1.``; migration 0015 writes it unsigned at the chain's
end, accepted until the first seal signs it (never once an ``s2.`` event is in the chain). The head is in the
database, so a writer there can put back an older genuine head row along with a tail cut to exactly it: the signed
checkpoints, kept outside the database, remain the anchor against that.
"""

from .chain import append, append_many, chain_lock, event_dict
from .checkpoints import (
    CHECKPOINT_TYPE,
    Checkpointer,
    check_checkpoint,
    checkpoint_claims,
    known_checkpoints,
    read_checkpoint_file,
)
from .encoding import GENESIS, canonical, event_hash, sha256_hex
from .keys import AuditKeys, audit_keys
from .sealing import Sealer, seal
from .verify import STALE_UNSEALED_SECONDS, unsealed, verify_chain

__all__ = [
    "CHECKPOINT_TYPE",
    "GENESIS",
    "STALE_UNSEALED_SECONDS",
    "AuditKeys",
    "Checkpointer",
    "Sealer",
    "append",
    "append_many",
    "audit_keys",
    "canonical",
    "chain_lock",
    "check_checkpoint",
    "checkpoint_claims",
    "event_dict",
    "event_hash",
    "known_checkpoints",
    "read_checkpoint_file",
    "seal",
    "sha256_hex",
    "unsealed",
    "verify_chain",
]
