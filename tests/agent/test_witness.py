"""The node as a witness of the audit log (service/agent/witness.py): it keeps the longest signed checkpoint it has
seen and says when the service later serves a shorter or rewritten chain; a checkpoint that does not verify never
replaces its copy."""

from __future__ import annotations

import json

import pytest

from service.agent.witness import read_kept, witness
from service.signing import CHECKPOINT_MEDIA_TYPE, KeyStore

HEAD_A, HEAD_B = "a" * 64, "b" * 64


@pytest.fixture
def ks(tmp_path):
    return KeyStore(tmp_path / "keys", create=True)


def cp(ks, last_seq, head=HEAD_A, **extra):
    return ks.sign(
        {
            "iss": "preflight",
            "iat": 1,
            "typ": "audit-checkpoint",
            "events": last_seq,
            "last_seq": last_seq,
            "head": head,
            **extra,
        },
        typ=CHECKPOINT_MEDIA_TYPE,
    )


def test_keeps_the_longest_and_reports_a_cut_or_a_rewrite(ks, tmp_path):
    copy, jwks = tmp_path / "node.checkpoint.jws", ks.jwks()
    first = witness(copy, cp(ks, 10), jwks)
    assert first.status == "kept" and read_kept(copy, jwks)[1]["last_seq"] == 10
    assert witness(copy, cp(ks, 10), jwks).status == "same"
    longer = witness(copy, cp(ks, 25, HEAD_B), jwks)
    assert longer.status == "kept" and read_kept(copy, jwks)[1]["last_seq"] == 25
    cut = witness(copy, cp(ks, 12), jwks)
    assert cut.status == "cut" and "seq 12" in cut.message and "seq 25" in cut.message
    assert cut.details()["kept"]["last_seq"] == 25 and cut.details()["served"]["last_seq"] == 12
    assert read_kept(copy, jwks)[1]["last_seq"] == 25  # the copy is not given up
    rewritten = witness(copy, cp(ks, 25, HEAD_A), jwks)
    assert rewritten.status == "rewritten" and read_kept(copy, jwks)[1]["head"] == HEAD_B
    assert oct(copy.stat().st_mode & 0o777) == "0o600"


def test_a_checkpoint_that_does_not_verify_never_replaces_the_copy(ks, tmp_path):
    copy, jwks = tmp_path / "c.jws", ks.jwks()
    witness(copy, cp(ks, 10), jwks)
    before = copy.read_bytes()
    other = KeyStore(tmp_path / "other", create=True)  # a spoofed server's own key
    hostile = [
        cp(other, 10**6),
        "junk",
        None,
        7,
        {"a": 1},
        "a.b.c",
        cp(ks, 10**6).replace(".", "x", 1),
        ks.sign({"last_seq": True, "head": HEAD_A}, typ=CHECKPOINT_MEDIA_TYPE),
        ks.sign({"last_seq": 2**63, "head": HEAD_A}, typ=CHECKPOINT_MEDIA_TYPE),
        ks.sign({"last_seq": 5, "head": "zz"}, typ=CHECKPOINT_MEDIA_TYPE),
        ks.sign({"last_seq": 11, "head": HEAD_A}, typ="application/vnd.preflight.plan+jwt"),
    ]
    for token in hostile:
        w = witness(copy, token, jwks)
        assert w.status == "ignored", token
        assert copy.read_bytes() == before
        json.dumps(w.details())


def test_an_unreadable_or_edited_copy_is_replaced_by_a_verified_one(ks, tmp_path):
    copy, jwks = tmp_path / "c.jws", ks.jwks()
    good = cp(ks, 99)
    h, p, sig = good.split(".")
    edited = f"{h}.{cp(ks, 98).split('.')[1]}.{sig}"  # a known key, a signature that does not match
    for junk in (b"\xff\xfe", b"x" * 20_000, edited.encode(), b"a.b.c"):
        copy.write_bytes(junk)
        assert read_kept(copy, jwks) == (None, None)
        assert witness(copy, cp(ks, 3), jwks).status == "kept"


def test_a_service_that_says_it_has_no_checkpoint_while_the_node_kept_one_is_a_cut(ks, tmp_path):
    """Emptying the checkpoint table (the service then answers 404) must not silence the node."""
    copy, jwks = tmp_path / "c.jws", ks.jwks()
    assert witness(copy, "", jwks).status == "none"  # a new service: nothing kept, nothing to say
    witness(copy, cp(ks, 40), jwks)
    w = witness(copy, "", jwks)
    assert w.status == "cut" and "seq 40" in w.message and w.details()["kept"]["last_seq"] == 40


def test_a_copy_signed_by_a_key_retired_since_still_counts(ks, tmp_path):
    copy = tmp_path / "c.jws"
    witness(copy, cp(ks, 40), ks.jwks())
    old = ks.active_kid
    ks.rotate()
    ks.retire(old)
    jwks = ks.jwks()
    assert [k["kid"] for k in jwks["keys"]] == [ks.active_kid]
    assert read_kept(copy, jwks)[1]["last_seq"] == 40
    assert witness(copy, cp(ks, 12), jwks).status == "cut"  # not silently replaced by a shorter chain


def test_headers_and_payloads_that_are_not_objects_are_malformed_not_a_crash():
    import base64 as b64

    from service.agent.verify import VerificationError, verify_jws

    def part(raw: bytes) -> str:
        return b64.urlsafe_b64encode(raw).decode().rstrip("=")

    for header in (b"[1]", b'"x"', b"7", b"null", b"[" * 100_000 + b"]" * 100_000):
        with pytest.raises(VerificationError) as err:
            verify_jws(f"{part(header)}.e30.AA", {"keys": []}, typ="x")
        assert err.value.reason == "malformed"
