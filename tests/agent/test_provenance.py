"""The weights' OpenSSF model signature (service/agent/provenance.py, bootcheck.py ``_check_provenance``): real
signatures made here with the ``model-signing`` package over a small weights directory and an ECDSA key generated
in the test — verified; a changed, added or missing file, or another signer, refused naming model.sig; no
signature reported, and refused when a production plan names a signer; a signature this node cannot check
(model-signing absent) refused in production, said elsewhere."""

from __future__ import annotations

import pathlib
import sys

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from service.agent import provenance
from service.agent.bootcheck import claim_problem, run_checks
from service.domain import weights_expect as we
from tests.agent.test_weights_expected import expected, hw, mem
from tests.support.gpus import install_nvidia_smi, weights_dir

model_signing = pytest.importorskip("model_signing")


def keypair(tmp_path: pathlib.Path, curve=None) -> tuple[pathlib.Path, str]:
    key = ec.generate_private_key(curve or ec.SECP256R1())
    private = tmp_path / f"signer-{id(key)}.pem"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public.decode("ascii")


def sign(directory: pathlib.Path, private: pathlib.Path) -> pathlib.Path:
    """As ``model_signing sign key DIR --private_key KEY`` does: model.sig in the directory, not part of itself."""
    sig = directory / "model.sig"
    model_signing.signing.Config().use_elliptic_key_signer(private_key=private).set_hashing_config(
        model_signing.hashing.Config().set_ignored_paths(paths=["model.sig"])
    ).sign(directory, sig)
    return sig


def check(tmp_path, uri: str, claim: dict | None):
    smi = str(install_nvidia_smi(tmp_path / "bin", "h100-sxm-8"))
    nc = {"hardware": hw(), "memory": mem(), **({"weights_expected": claim} if claim else {})}
    lines: list[str] = []
    found: dict = {}
    r = run_checks(
        {"jti": "p", "model_uri": uri, "env": {}, "node_checks": nc},
        nvidia_smi=smi,
        weights_root=None,
        verify_hashes=False,
        say=lines.append,
        found=found,
    )
    return r, found.get("provenance"), lines


@pytest.fixture
def signed(tmp_path):
    d = weights_dir(tmp_path / "m", shards=2)
    private, public = keypair(tmp_path)
    sign(d, private)
    return d, public


def test_a_key_signed_directory_verifies_offline_and_says_so(tmp_path, signed):
    d, public = signed
    r, prov, lines = check(tmp_path, str(d), expected(signer={"public_key": public}))
    assert r is None
    assert prov["status"] == "verified" and prov["file"] == str(d / "model.sig")
    assert prov["signer"].startswith("key sha256:")
    assert any(x.startswith(f"provenance: verified: {d / 'model.sig'} verified: signed by key sha256:") for x in lines)


@pytest.mark.parametrize("change", ["tamper", "add", "remove"])
def test_a_changed_added_or_missing_file_is_refused_naming_the_signature_and_the_file(tmp_path, signed, change):
    d, public = signed
    shard = d / "model-00001-of-00002.safetensors"
    if change == "tamper":
        data = bytearray(shard.read_bytes())
        data[-1] ^= 1
        shard.write_bytes(bytes(data))
        named = "changed: model-00001-of-00002.safetensors"
    elif change == "add":
        (d / "modeling_evil.py").write_text("import os\n")
        named = "added: modeling_evil.py"
    else:
        shard.unlink()
        (d / "model.safetensors.index.json").unlink()  # the weights check would say the shard first
        named = "missing: model-00001-of-00002.safetensors, model.safetensors.index.json"
    for environment in ("production", "benchmark"):  # a signature that does not verify is never started
        r, prov, _ = check(tmp_path, str(d), expected(environment=environment, signer={"public_key": public}))
        assert (r.check, r.reason) == ("weights", "signature_failed")
        assert r.message.startswith(f"{d / 'model.sig'} does not verify for key sha256:") and r.message.endswith(named)
        assert prov["status"] == "failed" and r.details["provenance"] == prov


def test_another_signer_is_refused(tmp_path, signed):
    d, _ = signed
    _, other = keypair(tmp_path, ec.SECP384R1())
    r, prov, _ = check(tmp_path, str(d), expected(signer={"public_key": other}))
    assert (r.reason, prov["status"]) == ("signature_failed", "failed") and "Key mismatch" in r.message


def test_unsigned_weights_are_reported_and_refused_when_a_production_plan_names_a_signer(tmp_path):
    d = weights_dir(tmp_path / "m", shards=2)
    r, prov, lines = check(tmp_path, str(d), expected())
    assert r is None and prov["status"] == "unsigned"
    assert f"provenance: unsigned: no model.sig in {d}: the weights carry no signature" in lines
    _, public = keypair(tmp_path)
    r, prov, _ = check(tmp_path, str(d), expected(signer={"public_key": public}))
    assert (r.check, r.reason, prov["status"]) == ("weights", "signature_missing", "unsigned")
    assert r.message.startswith("the plan names a signer (key sha256:") and r.message.endswith("has no model.sig")
    r, prov, lines = check(tmp_path, str(d), expected(environment="benchmark", signer={"public_key": public}))
    assert (
        r is None
        and prov["status"] == "unsigned"
        and any(x.startswith("provenance: unsigned: the plan") for x in lines)
    )


def test_a_signature_without_a_named_signer_is_unverified_not_refused(tmp_path, signed):
    d, _ = signed
    for claim in (expected(), None):  # a plan without a signer, and one signed before expectations
        r, prov, _ = check(tmp_path, str(d), claim)
        assert r is None and prov["status"] == "unverified" and "the plan names no signer" in prov["message"]


def test_without_model_signing_a_named_signer_is_unverified_refused_in_production(tmp_path, signed, monkeypatch):
    d, public = signed
    monkeypatch.setitem(sys.modules, "model_signing", None)  # as on a node installed without the provenance extra
    r, prov, _ = check(tmp_path, str(d), expected(signer={"public_key": public}))
    assert (r.reason, prov["status"]) == ("signature_unverifiable", "unverified")
    assert "model-signing is not installed on this node (pip install 'preflight[provenance]')" in r.message
    r, prov, lines = check(tmp_path, str(d), expected(environment="benchmark", signer={"public_key": public}))
    assert r is None and prov["status"] == "unverified" and any("not installed" in x for x in lines)


def test_a_sigstore_signer_without_its_trust_root_is_unverified(tmp_path, signed):
    d, _ = signed
    bad_root = tmp_path / "trust.json"
    bad_root.write_text("{}")
    signer = {"identity": "release@example.com", "oidc_issuer": "https://accounts.example.com"}
    r = provenance.check(d, expected(signer=signer), trust_config=bad_root)
    assert (r.status, r.refuse) == ("unverified", True) and r.message.startswith(
        f"{d / 'model.sig'} cannot be verified"
    )


def test_a_skipped_weights_check_checks_no_signature(tmp_path, signed):
    d, _ = signed
    r, prov, _ = check(tmp_path, str(d), expected(weights_check="skip", skip_reason="vendor loader"))
    assert r is None and prov is None


# --- the signer a plan may name ---------------------------------------------------------------------------------------


def _pem(key) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


@pytest.mark.parametrize(
    "signer, problem",
    [
        ("key", "must be an object"),
        ({}, "must be {public_key}"),
        ({"public_key": "x", "identity": "y"}, "must be {public_key}"),
        ({"public_key": "not pem"}, "public_key is not a PEM public key"),
        ({"public_key": "A" * 5000}, "at most 4096 ASCII characters"),
        ({"public_key": _pem(ed25519.Ed25519PrivateKey.generate())}, "must be an elliptic-curve key on secp256r1"),
        ({"public_key": _pem(rsa.generate_private_key(65537, 2048))}, "must be an elliptic-curve key"),
        ({"public_key": _pem(ec.generate_private_key(ec.SECP256K1()))}, "must be an elliptic-curve key"),
        ({"identity": "a@b", "oidc_issuer": "http://x"}, "oidc_issuer must be an https:// URL"),
        ({"identity": "", "oidc_issuer": "https://x"}, "identity must be printable text"),
        ({"identity": "a\x1b[2J", "oidc_issuer": "https://x"}, "identity must be printable text"),
    ],
)
def test_a_signer_nobody_can_verify_with_is_refused_naming_why(signer, problem):
    assert problem in (we.signer_problem(signer) or "")
    nc = {"hardware": hw(), "memory": mem(), "weights_expected": {**expected(), "signature": signer}}
    assert "weights_expected.signature" in (claim_problem(nc) or "")


def test_the_claim_carries_the_signer(tmp_path):
    _, public = keypair(tmp_path)
    assert expected(signer={"public_key": public})["signature"] == {"public_key": public}
    sigstore = {"identity": "release@example.com", "oidc_issuer": "https://accounts.google.com"}
    assert we.signer_problem(sigstore) is None and expected(signer=sigstore)["signature"] == sigstore
    assert "signature" not in expected()
