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

from ..signing import CHECKPOINT_MEDIA_TYPE
from .trust import write_text_atomic
from .verify import VerificationError, verify_jws

HEX64 = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Witnessed:
    status: str  # "kept" (new or longer) | "same" | "cut" | "rewritten" | "ignored" (did not verify)
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
    if type(seq) is not int or not 0 < seq < 2**62 or type(head) is not str or len(head) != 64 \
            or not set(head) <= HEX64:
        raise VerificationError("malformed", "checkpoint claims last_seq / head missing or of the wrong type")
    return claims


def read_kept(path: pathlib.Path, jwks: dict) -> tuple[str | None, dict[str, Any] | None]:
    """The copy the node keeps: (token, claims), or (None, None) when there is none or it no longer verifies (a key
    retired since: the next served checkpoint replaces it)."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None, None
    if len(token) > 16_384:
        return None, None
    try:
        return token, _claims(token, jwks)
    except VerificationError:
        return None, None


def witness(path: pathlib.Path, served_token: Any, jwks: dict) -> Witnessed:
    """Compare the checkpoint the service serves with the node's copy at ``path``; keep the longer (atomically)."""
    try:
        served = _claims(served_token, jwks)
    except VerificationError as exc:
        return Witnessed("ignored", f"the service's audit checkpoint does not verify ({exc}): ignored")
    _, kept = read_kept(path, jwks)
    if kept is not None and served["last_seq"] < kept["last_seq"]:
        return Witnessed("cut", f"the service's audit chain ends at seq {served['last_seq']} but this node kept a "
                                f"checkpoint at seq {kept['last_seq']}: audit events were deleted", kept, served)
    if kept is not None and served["last_seq"] == kept["last_seq"]:
        if served["head"] != kept["head"]:
            return Witnessed("rewritten", f"the service's audit chain at seq {served['last_seq']} has another head "
                                          f"than the checkpoint this node kept: history was rewritten", kept, served)
        return Witnessed("same", "the audit checkpoint is the one this node kept", kept, served)
    write_text_atomic(path, served_token + "\n")
    return Witnessed("kept", f"kept the audit checkpoint at seq {served['last_seq']}", served, served)
