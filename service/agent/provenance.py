"""Provenance of the weights, where the checkpoint has it: an OpenSSF model signature (the ``model-signing``
package's Sigstore bundle, ``model.sig`` in the weights directory) verified against the signer the plan names
(``weights_expected.signature``: domain/weights_expect.py) before vLLM starts.

Results, printed on the console, sent in the ``started`` report (``details.provenance``) and so kept in the audit:

- ``verified``: the signature is the named signer's and every file in the directory has the digest it signed;
- ``failed``: the signature does not verify (another signer, a file changed, added or missing): always refused,
  naming the signature file and what differs;
- ``unsigned``: no ``model.sig``. Refused when the plan names a signer and is a production plan
  (``unchecked: refuse``); otherwise said and started;
- ``unverified``: a signature this node cannot check (the plan names no signer, model-signing is not installed,
  Sigstore's trust root cannot be had). Refused when the plan names a signer and is a production plan.

The key path is offline. The Sigstore path needs a trust root: ``--sigstore-trust-config FILE`` (a Sigstore
ClientTrustConfig JSON), else model-signing fetches the public-good instance's through TUF (network, cached).
Verification hashes every file of the directory (model-signing reads all the bytes): minutes for hundreds of GB.
"""

from __future__ import annotations

import pathlib
import re
import tempfile
from dataclasses import dataclass, field
from typing import Any

from ..domain.text import printable

# model-signing's default signature file name (model_signing 1.1.1 _cli.py:57, ``--signature`` default)
SIGNATURE_FILE = "model.sig"
MAX_SIGNATURE_BYTES = 16 << 20  # a Sigstore bundle over a file manifest: kilobytes per thousand files
INSTALL_HINT = "pip install 'preflight[provenance]'"


@dataclass
class Provenance:
    status: str  # verified, failed, unsigned, unverified
    message: str
    refuse: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        """What the ``started`` and ``refused`` reports carry (``details.provenance``)."""
        return {"status": self.status, "message": self.message[:500], **self.details}


def check(directory: pathlib.Path, expected: dict | None, *, trust_config: pathlib.Path | None = None) -> Provenance:
    """The signature of ``directory`` against the plan's ``weights_expected`` (None: a plan without one)."""
    signer = (expected or {}).get("signature")
    production = (expected or {}).get("unchecked") == "refuse"
    sig = directory / SIGNATURE_FILE
    where = {"file": str(sig)}
    if not sig.is_file():
        if signer is None:
            return Provenance("unsigned", f"no {SIGNATURE_FILE} in {directory}: the weights carry no signature")
        return Provenance(
            "unsigned",
            f"the plan names a signer ({_who(signer)}) but {directory} has no {SIGNATURE_FILE}",
            refuse=production,
            details={**where, "signer": _who(signer)},
        )
    if signer is None:
        return Provenance(
            "unverified", f"{sig} is present but the plan names no signer to verify it with", details=where
        )
    if sig.stat().st_size > MAX_SIGNATURE_BYTES:
        return Provenance("failed", f"{sig} is larger than {MAX_SIGNATURE_BYTES} bytes", True, where)
    try:
        config = _verifier(signer, trust_config)
    except ImportError as exc:  # the optional extra is absent (or broken): a signature nobody here can check
        why = f"model-signing is not installed on this node ({INSTALL_HINT}): {exc}"
        return Provenance("unverified", f"{sig} cannot be verified: {why}"[:500], production, where)
    except Exception as exc:  # a trust root that cannot be had (Sigstore's TUF without network), a bad config file
        why = f"{exc.__class__.__name__}: {printable(str(exc))[:300]}"
        return Provenance("unverified", f"{sig} cannot be verified: {why}", production, where)
    try:
        _verify(config, directory, sig)
    except Exception as exc:  # model-signing raises ValueError (mismatch, key), InvalidSignature, parse errors
        what = _what_differs(str(exc)) or printable(str(exc) or exc.__class__.__name__)[:400]
        return Provenance("failed", f"{sig} does not verify for {_who(signer)}: {what}", True, where)
    return Provenance(
        "verified", f"{sig} verified: signed by {_who(signer)}", details={**where, "signer": _who(signer)}
    )


# how model-signing says what differs (model_signing 1.1.1 verifying.py:130-160): a list of these lines, the
# digests as Python reprs of bytes (unreadable on a console: the files are named instead)
_DIFFS = (  # a quote may come escaped (a list's repr escapes ' in an item holding both kinds of quote)
    ("changed", re.compile(r"Hash mismatch for \\?'([^'\\]+)\\?'")),
    ("added", re.compile(r"Extra files found in model \\?'[^']*\\?': ([^\"'\\\]]+)")),
    ("missing", re.compile(r"Missing files in model \\?'[^']*\\?': ([^\"'\\\]]+)")),
)


def _what_differs(message: str) -> str | None:
    """The files a ``Signature mismatch`` names, by kind: ``changed: a; added: b``; None for another error."""
    if not message.startswith("Signature mismatch"):
        return None
    parts = []
    for kind, pattern in _DIFFS:
        names = [n.strip() for m in pattern.findall(message) for n in m.split(",")]
        if names:
            parts.append(f"{kind}: {printable(', '.join(names[:20]))[:300]}" + (" …" if len(names) > 20 else ""))
    return "; ".join(parts) or None


def _who(signer: dict) -> str:
    if "public_key" in signer:
        import hashlib

        return "key sha256:" + hashlib.sha256(signer["public_key"].encode("ascii", "replace")).hexdigest()[:16]
    return f"{printable(signer['identity'])[:200]} ({printable(signer['oidc_issuer'])[:200]})"


def _verifier(signer: dict, trust_config: pathlib.Path | None):
    """model-signing's verification config for the plan's signer (model_signing 1.1.1 verifying.py:203-258)."""
    from model_signing import verifying

    config = verifying.Config()
    if "public_key" in signer:  # model-signing reads the key from a file: a private temporary one
        with tempfile.NamedTemporaryFile("w", suffix=".pub", encoding="ascii") as f:
            f.write(signer["public_key"])
            f.flush()
            return config.use_elliptic_key_verifier(public_key=f.name)  # read here (sign_ec_key.py:156)
    return config.use_sigstore_verifier(
        identity=signer["identity"], oidc_issuer=signer["oidc_issuer"], trust_config=trust_config
    )


def _verify(config, directory: pathlib.Path, sig: pathlib.Path) -> None:
    """As ``model_signing verify`` does (model_signing 1.1.1 _cli.py:750-761): the signature file itself and git's
    files are not part of what was signed; every other file must be. Symlinks are followed (the Hugging Face cache
    layout links a snapshot's files to its blobs; only the digests are compared, manifest.py:442)."""
    from model_signing import hashing

    config.set_hashing_config(
        hashing.Config().set_ignored_paths(paths=[SIGNATURE_FILE], ignore_git_paths=True).set_allow_symlinks(True)
    ).verify(directory, sig)
