"""The node as a witness of the audit log: at every boot the agent fetches the service's newest signed checkpoint
(``GET /v1/audit/checkpoints/latest``: chain length, head hash and id digest, signed with the service key), verifies
it against the node's pinned trust root, and keeps the longest one it has seen in a file next to its state.

A checkpoint the node kept is a copy of the chain's head that nobody with only the database can take back: when the
service later serves a *shorter* chain than the node kept (events deleted, a table emptied) or another head at the
same length (history rewritten), the agent says so on its console and in its next report, and an auditor can check
the database against the node's copy (``preflight audit verify --checkpoint FILE``). A longer chain replaces the
copy; whether it extends the kept one needs the events in between, which only the verifier over the database has.
A checkpoint that does not verify (a spoofed or broken server) is ignored and never replaces the copy."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Any

from ..signing import CHECKPOINT_MEDIA_TYPE, b64json
from .files import read_file
from .trust import write_text_atomic
from .verify import VerificationError, verify_jws

HEX64 = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Witnessed:
    status: str  # "kept" (new or longer) | "same" | "cut" | "rewritten" | "ignored" (did not verify) | "none"
    message: str
    kept: dict[str, Any] | None = None  # the claims of the copy the node holds afterwards
    served: dict[str, Any] | None = None

    def details(self) -> dict[str, Any]:
        """What the agent's next report carries (``details.audit_checkpoint``)."""
        out: dict[str, Any] = {"status": self.status}
        for name, c in (("kept", self.kept), ("served", self.served)):
            if c is not None:
                out[name] = {"last_seq": c["last_seq"], "head": c["head"], "iat": c.get("iat")}
        if self.status in ("cut", "rewritten", "ignored"):
            out["message"] = self.message
        return out


def _claims(token: str, jwks: dict) -> dict[str, Any]:
    claims, _ = verify_jws(token, jwks, typ=CHECKPOINT_MEDIA_TYPE)
    seq, head = claims.get("last_seq"), claims.get("head")
    if (
        type(seq) is not int
        or not 0 < seq < 2**62
        or type(head) is not str
        or len(head) != 64
        or not set(head) <= HEX64
    ):
        raise VerificationError("malformed", "checkpoint claims last_seq / head missing or of the wrong type")
    return claims


def read_kept(path: pathlib.Path, jwks: dict) -> tuple[str | None, dict[str, Any] | None]:
    """The copy the node keeps: (token, claims), or (None, None) when there is none or it is unusable. A copy whose
    key the node no longer trusts (retired since) still counts: the agent verified it before writing it, and only
    the node itself writes that file — so retiring a key does not wipe the node's memory of the chain."""
    try:  # never through a symlink, only a regular file, bounded (agent/files.py)
        token = read_file(path, limit=16_384 + 2, what="the audit checkpoint copy").decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None, None
    if len(token) > 16_384:
        return None, None
    try:
        return token, _claims(token, jwks)
    except VerificationError as exc:
        if exc.reason != "unknown_kid":
            return None, None
    try:  # written by this agent after verification; its key retired since
        claims = b64json(token.split(".")[1])
    except (ValueError, IndexError, RecursionError):
        return None, None
    if not isinstance(claims, dict) or type(claims.get("last_seq")) is not int or type(claims.get("head")) is not str:
        return None, None
    return token, claims


def witness(path: pathlib.Path, served_token: Any, jwks: dict) -> Witnessed:
    """Compare the checkpoint the service serves with the node's copy at ``path``; keep the longer (atomically)."""
    if served_token == "":  # the service says it has no checkpoint at all
        _, kept = read_kept(path, jwks)
        if kept is None:
            return Witnessed("none", "the service has no audit checkpoint yet")
        return Witnessed(
            "cut",
            f"the service says it has no audit checkpoint, but this node kept one at seq "
            f"{kept['last_seq']}: its checkpoints were removed",
            kept,
            None,
        )
    try:
        served = _claims(served_token, jwks)
    except VerificationError as exc:
        return Witnessed("ignored", f"the service's audit checkpoint does not verify ({exc}): ignored")
    _, kept = read_kept(path, jwks)
    if kept is not None and served["last_seq"] < kept["last_seq"]:
        return Witnessed(
            "cut",
            f"the service's audit chain ends at seq {served['last_seq']} but this node kept a "
            f"checkpoint at seq {kept['last_seq']}: audit events were deleted",
            kept,
            served,
        )
    if kept is not None and served["last_seq"] == kept["last_seq"]:
        if served["head"] != kept["head"]:
            return Witnessed(
                "rewritten",
                f"the service's audit chain at seq {served['last_seq']} has another head "
                f"than the checkpoint this node kept: history was rewritten",
                kept,
                served,
            )
        return Witnessed("same", "the audit checkpoint is the one this node kept", kept, served)
    write_text_atomic(path, served_token + "\n")
    return Witnessed("kept", f"kept the audit checkpoint at seq {served['last_seq']}", served, served)
