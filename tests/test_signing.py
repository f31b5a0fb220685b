"""KeyStore.sign builds the compact JWS itself (service/signing.py:compact_ed25519): it must be byte for byte what
joserfc produces for the same header, payload and key, and verify with joserfc."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from joserfc import jws
from joserfc.jwk import OKPKey

from service.signing import ALG, FRESHNESS_MEDIA_TYPE, PLAN_MEDIA_TYPE, KeyStore, compact_ed25519

KEY = OKPKey.generate_key("Ed25519")
claims = st.dictionaries(
    st.text(max_size=12),
    st.one_of(st.integers(), st.text(), st.lists(st.text(max_size=30), max_size=12), st.booleans(), st.none()),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(claims, st.sampled_from([PLAN_MEDIA_TYPE, FRESHNESS_MEDIA_TYPE, "x\u00e9"]), st.text(min_size=1, max_size=20))
def test_byte_for_byte_what_joserfc_signs(body, typ, kid):
    header = {"alg": ALG, "kid": kid, "typ": typ}
    payload = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    ours = compact_ed25519(KEY, header, payload)
    assert ours == jws.serialize_compact(header, payload, KEY, algorithms=[ALG])
    obj = jws.deserialize_compact(ours, KEY, algorithms=[ALG])
    assert obj.payload == payload and obj.headers() == header


def test_keystore_sign_verifies_with_the_published_key(tmp_path):
    keys = KeyStore(tmp_path / "keys", create=True)
    signed = keys.sign({"sub": "gpu-1", "seq": 3})
    public = OKPKey.import_key(keys.public_keys()[0])
    obj = jws.deserialize_compact(signed, public, algorithms=[ALG])
    assert json.loads(obj.payload) == {"seq": 3, "sub": "gpu-1"}
    assert obj.headers() == {"alg": ALG, "kid": keys.active_kid, "typ": PLAN_MEDIA_TYPE}


@pytest.mark.parametrize(
    "header",
    [
        {"alg": "EdDSA", "kid": "k", "typ": "t"},
        {"alg": ALG, "kid": "k"},
        {"alg": ALG, "kid": "k", "typ": "t", "crit": ["x"]},
    ],
)
def test_other_headers_are_not_signed_here(header):
    with pytest.raises(ValueError):
        compact_ed25519(KEY, header, b"{}")


def test_a_public_key_cannot_sign():
    public = OKPKey.import_key(KEY.as_dict(private=False))
    with pytest.raises(ValueError):
        compact_ed25519(public, {"alg": ALG, "kid": "k", "typ": "t"}, b"{}")
