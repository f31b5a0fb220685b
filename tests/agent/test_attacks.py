"""Attacks the agent must refuse (fail closed): each one a test, on real signed plans."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import pytest
from joserfc import jws
from joserfc.jwk import OKPKey

from service.agent.verify import VerificationError, verify_freshness, verify_plan
from service.signing import (
    ALG,
    FRESHNESS_MEDIA_TYPE,
    PLAN_MEDIA_TYPE,
    KeyStore,
    freshness_claims,
    plan_claims,
    plan_digest,
)

AUD = "preflight-agent"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.fixture
def store(tmp_path):
    return KeyStore(tmp_path / "keys")


def claims(**over):
    base = plan_claims(
        issuer="preflight",
        audience=AUD,
        node="gpu-01",
        plan_id="p-1",
        seq=5,
        manifest_digest="sha256:00",
        vllm_version="0.33.0",
        argv=["vllm", "serve", "s3://m", "--tensor-parallel-size", "8"],
        env={},
        model_uri="s3://m",
    )
    base.update(over)
    return base


def refused(token, jwks, reason, **kw):
    with pytest.raises(VerificationError) as exc:
        verify_plan(token, jwks, node=kw.pop("node", "gpu-01"), audience=AUD, **kw)
    assert exc.value.reason == reason, exc.value


def test_genuine_plan_verifies(store):
    v = verify_plan(store.sign(claims()), store.jwks(), node="gpu-01", audience=AUD, last_seq=4)
    assert v.seq == 5 and v.argv[:2] == ["vllm", "serve"]


def test_tampered_payload(store):
    h, p, s = store.sign(claims()).split(".")
    evil = json.loads(base64.urlsafe_b64decode(p + "=="))
    evil["argv"] = ["vllm", "serve", "s3://m", "--tensor-parallel-size", "1"]
    refused(f"{h}.{b64(json.dumps(evil).encode())}.{s}", store.jwks(), "bad_signature")


def test_tampered_header(store):
    h, p, s = store.sign(claims()).split(".")
    header = json.loads(base64.urlsafe_b64decode(h + "=="))
    header["x-note"] = "changed"
    refused(f"{b64(json.dumps(header).encode())}.{p}.{s}", store.jwks(), "bad_signature")


def test_wrong_key(store):
    """Signed by another Ed25519 key under the genuine key's kid."""
    attacker = OKPKey.generate_key("Ed25519")
    header = {"alg": ALG, "kid": store.active_kid, "typ": PLAN_MEDIA_TYPE}
    forged = jws.serialize_compact(header, json.dumps(claims()).encode(), attacker, algorithms=[ALG])
    refused(forged, store.jwks(), "bad_signature")


def test_unknown_kid(store, tmp_path):
    other = KeyStore(tmp_path / "other")
    refused(other.sign(claims()), store.jwks(), "unknown_kid")


def test_alg_none(store):
    header = b64(json.dumps({"alg": "none", "kid": store.active_kid, "typ": PLAN_MEDIA_TYPE}).encode())
    payload = b64(json.dumps(claims()).encode())
    refused(f"{header}.{payload}.", store.jwks(), "alg_refused")


def test_hs256_signed_with_the_public_key(store):
    jwk = store.jwks()["keys"][0]
    header = b64(json.dumps({"alg": "HS256", "kid": jwk["kid"], "typ": PLAN_MEDIA_TYPE}).encode())
    payload = b64(json.dumps(claims()).encode())
    secret = json.dumps(jwk).encode()  # the classic confusion: the public key used as an HMAC secret
    sig = b64(hmac.new(secret, f"{header}.{payload}".encode(), hashlib.sha256).digest())
    refused(f"{header}.{payload}.{sig}", store.jwks(), "alg_refused")
    sig2 = b64(
        hmac.new(base64.urlsafe_b64decode(jwk["x"] + "="), f"{header}.{payload}".encode(), hashlib.sha256).digest()
    )
    refused(f"{header}.{payload}.{sig2}", store.jwks(), "alg_refused")


def test_a_plan_has_no_expiry_its_freshness_statement_does(store):
    """What a plan says does not expire (a node booting a month later runs it); the statement that it is still the
    node's current plan does."""
    now = int(time.time())
    old = store.sign(claims(iat=now - 40 * 86400, nbf=now - 40 * 86400))
    plan = verify_plan(old, store.jwks(), node="gpu-01", audience=AUD)
    fresh = store.sign(statement(old, now=now), typ=FRESHNESS_MEDIA_TYPE)
    assert verify_freshness(fresh, store.jwks(), plan_token=old, plan=plan, node="gpu-01", audience=AUD)["seq"] == 5
    stale = store.sign(statement(old, now=now - 7200), typ=FRESHNESS_MEDIA_TYPE)
    fresh_refused(stale, store, old, "stale")


def statement(plan_token, **over):
    now = over.pop("now", int(time.time()))
    base = freshness_claims(
        issuer="preflight",
        audience=AUD,
        node="gpu-01",
        plan_id="p-1",
        seq=5,
        digest=plan_digest(plan_token),
        ttl=3600,
        acked_seq=0,
        now=now,
    )
    base.update(over)
    return base


def fresh_refused(token, store, plan_token, reason, jwks=None, **kw):
    plan = verify_plan(plan_token, store.jwks(), node="gpu-01", audience=AUD)
    with pytest.raises(VerificationError) as exc:
        verify_freshness(
            token, jwks or store.jwks(), plan_token=plan_token, plan=plan, node="gpu-01", audience=AUD, **kw
        )
    assert exc.value.reason == reason, exc.value


def test_freshness_statement_attacks(store, tmp_path):
    token = store.sign(claims())
    other_plan = store.sign(claims(argv=["vllm", "serve", "s3://other"]))
    fresh_refused("", store, token, "no_freshness")
    fresh_refused(store.sign(statement(other_plan), typ=FRESHNESS_MEDIA_TYPE), store, token, "freshness_mismatch")
    fresh_refused(store.sign(statement(token, seq=6), typ=FRESHNESS_MEDIA_TYPE), store, token, "freshness_mismatch")
    fresh_refused(store.sign(statement(token, sub="gpu-02"), typ=FRESHNESS_MEDIA_TYPE), store, token, "wrong_node")
    fresh_refused(store.sign(statement(token), typ=PLAN_MEDIA_TYPE), store, token, "typ")  # a plan is not one
    fresh_refused(
        KeyStore(tmp_path / "other").sign(statement(token), typ=FRESHNESS_MEDIA_TYPE), store, token, "unknown_kid"
    )
    fresh_refused(store.sign(statement(token, exp=True), typ=FRESHNESS_MEDIA_TYPE), store, token, "claim_type")
    old = store.sign(statement(token, now=int(time.time()) - 600), typ=FRESHNESS_MEDIA_TYPE)
    fresh_refused(old, store, token, "stale", not_before=time.time() - 120)  # a node without state wants a new one


def test_claim_types_issuer_and_same_seq_rules(store):
    refused(store.sign(claims(seq=True)), store.jwks(), "claim_type")
    refused(store.sign(claims(seq="5")), store.jwks(), "claim_type")
    refused(store.sign(claims(env={"VLLM_X": 1})), store.jwks(), "claim_type")
    refused(store.sign({k: v for k, v in claims().items() if k != "iss"}), store.jwks(), "claim_missing")
    refused(store.sign(claims(iss="someone")), store.jwks(), "wrong_issuer", issuer="preflight")
    token = store.sign(claims())
    assert verify_plan(token, store.jwks(), node="gpu-01", audience=AUD, last_seq=5, last_plan_id="p-1").seq == 5
    refused(token, store.jwks(), "replayed_seq", last_seq=5, last_plan_id="p-other")


@pytest.mark.parametrize(
    "env",
    [
        {"PATH": "/tmp/evil"},
        {"LD_PRELOAD": "/tmp/x.so"},
        {"PYTHONPATH": "/tmp"},
        {"LD_LIBRARY_PATH": "/tmp"},
        {"SOMETHING_ELSE": "1"},
        # what the releases' own source shows is imported, unpickled or turns a safety check off
        {"TRITON_CACHE_MANAGER": "evil.mod:Manager"},
        {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},
        {"VLLM_SERVER_DEV_MODE": "1"},
        {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"},
        {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
        {"VLLM_LOGGING_CONFIG_PATH": "/tmp/log.json"},
    ],
)
def test_plan_env_that_picks_the_binary_or_loader_is_refused(store, env):
    refused(store.sign(claims(env={"VLLM_LOGGING_LEVEL": "INFO", **env})), store.jwks(), "env_not_allowed")


def test_not_yet_valid(store):
    now = int(time.time())
    refused(store.sign(claims(iat=now, nbf=now + 3600)), store.jwks(), "not_yet_valid")


def test_another_nodes_plan(store):
    refused(store.sign(claims(sub="gpu-02")), store.jwks(), "wrong_node")


def test_wrong_audience(store):
    refused(store.sign(claims(aud="someone-else")), store.jwks(), "wrong_audience")


def test_older_seq_replayed(store):
    token = store.sign(claims(seq=3))
    refused(token, store.jwks(), "replayed_seq", last_seq=5)
    refused(token, store.jwks(), "replayed_seq", last_seq=4)


def test_retired_key_no_longer_verifies_and_rotation_keeps_old_plans(store):
    old = store.sign(claims())
    old_kid = store.active_kid
    store.rotate()
    assert verify_plan(old, store.jwks(), node="gpu-01", audience=AUD).kid == old_kid  # still published
    store.retire(old_kid)
    refused(old, store.jwks(), "unknown_kid")


def test_private_key_files_are_0600(store):
    for f in store.dir.glob("*.jwk"):
        assert f.stat().st_mode & 0o777 == 0o600
    assert all("d" not in k for k in store.jwks()["keys"])


def test_legacy_eddsa_name_accepted(store):
    key = OKPKey.import_key(json.loads((store.dir / f"{store.active_kid}.jwk").read_text()))
    token = jws.serialize_compact(
        {"alg": "EdDSA", "kid": store.active_kid, "typ": PLAN_MEDIA_TYPE},
        json.dumps(claims()).encode(),
        key,
        algorithms=["EdDSA"],
    )
    assert verify_plan(token, store.jwks(), node="gpu-01", audience=AUD).seq == 5


def test_a_running_service_picks_up_a_rotation_made_by_the_cli(store, tmp_path):
    """`preflight keys rotate` writes the key directory; another KeyStore (the service) signs with the new key."""
    service = KeyStore(store.dir)
    old = service.active_kid
    cli = KeyStore(store.dir)
    new = cli.rotate()
    token = service.sign(claims())
    assert new != old and json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))["kid"] == new
    assert {k["kid"] for k in service.jwks()["keys"]} == {old, new}
    cli.retire(old)
    assert {k["kid"] for k in service.jwks()["keys"]} == {new}


def test_key_set_chain_starts_for_an_existing_key_directory_and_survives_a_read_only_one(store, tmp_path):
    (store.dir / "keysets.json").unlink()  # a key directory from before the chain
    again = KeyStore(store.dir)
    assert again.keyset_version == 1 and (store.dir / "keysets.json").exists()
    assert json.loads((store.dir / "keysets.json").read_text())["keysets"] == again.keysets()
    (store.dir / "keysets.json").unlink()
    store.dir.chmod(0o500)
    try:
        ro = KeyStore(store.dir, create=False)  # unwritable (unless root): the same statement, deterministic bytes
        assert ro.keysets() == again.keysets()
    finally:
        store.dir.chmod(0o700)
    (store.dir / "keysets.json").write_text('{"keysets": ["garbage"]}')
    assert KeyStore(store.dir).keyset_version == 2  # the published set follows an unreadable entry


def test_a_key_id_never_starts_with_a_dash(tmp_path, monkeypatch):
    """`preflight keys retire -X5P…` reads a leading '-' as an option (1 key in 64): key ids never start with one."""
    from joserfc.jwk import OKPKey

    from service.signing import KeyStore

    real = OKPKey.thumbprint
    calls = []

    def dashed_first(self, *a, **k):
        calls.append(1)
        return "-" + real(self, *a, **k)[1:] if len(calls) == 1 else real(self, *a, **k)

    monkeypatch.setattr(OKPKey, "thumbprint", dashed_first)
    ks = KeyStore(tmp_path / "keys", create=True)
    kid = ks.rotate()
    assert not kid.startswith("-") and not ks.active_kid.startswith("-") and len(calls) >= 2


def test_the_node_name_is_compared_without_regard_to_case(store):
    """Node names are case-insensitive (stored in lower case): an agent run with ``--node GPU-01`` takes the plan
    signed for ``gpu-01``, and a plan signed before the names were lowered for ``GPU-01`` still verifies on
    ``gpu-01``; another name is still refused."""
    token = store.sign(claims())
    assert verify_plan(token, store.jwks(), node="GPU-01", audience=AUD).claims["sub"] == "gpu-01"
    assert verify_plan(store.sign(claims(sub="GPU-01")), store.jwks(), node="gpu-01", audience=AUD).seq == 5
    refused(token, store.jwks(), "wrong_node", node="gpu-02")
