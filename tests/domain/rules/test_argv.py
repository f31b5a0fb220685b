"""argv_roundtrip / model_reference and flag_unjudged (service/domain/rules/argv.py): the rendered argv parses back,
a model reference vLLM would misread is refused, options that change what is loaded without being judged are
reported."""

from __future__ import annotations

import pytest

from service.domain.request import LaunchRequest
from service.domain.validate import validate
from tests.support import request
from tests.support.catalogue import MODEL, judged


def test_model_uri_that_is_an_option_is_refused():
    req = request(MODEL, count=1)
    req["model"]["uri"] = "--model=/tmp/other"
    r = validate(LaunchRequest.model_validate(req), alternatives=False)
    assert r.verdict == "reject" and any(f.rule == "model_reference" for f in r.findings)
    for good in ("meta-llama/Llama-3.1-8B", "/models/llama-3.1-8b", "s3://weights/llama-3.1-8b"):
        req["model"]["uri"] = good
        r = validate(LaunchRequest.model_validate(req), alternatives=False)
        assert not any(f.rule in ("model_reference", "argv_roundtrip") for f in r.findings), good


def test_json_or_str_objects_longer_than_a_string_round_trip():
    r = judged({"hf_overrides": {f"k{i}": "x" * 60 for i in range(900)}})
    assert not [f for f in r.errors if f.rule == "argv_roundtrip"]


@pytest.mark.parametrize("uri", ["/models/x\u202ey", "s3://b/x\u00a0--trust-remote-code", "org/na\u200bme"])
def test_model_references_with_invisible_characters_are_refused(uri):
    req = request(MODEL, count=1)
    req["model"]["uri"] = uri
    r = validate(LaunchRequest.model_validate(req), alternatives=False)
    assert any(f.rule == "model_reference" for f in r.errors)


def test_load_format_dummy_and_unjudged_loads():
    req = request(MODEL, count=1, load_format="dummy")
    r = validate(LaunchRequest.model_validate(req), alternatives=False)
    assert any(f.rule == "flag_unjudged" and f.field == "engine_args.load_format" for f in r.errors)
    warned = judged(
        {
            "revision": "evil-branch",
            "speculative_config": {"method": "eagle", "model": "evil/draft", "num_speculative_tokens": 3},
        }
    )
    assert {f.field for f in warned.findings if f.rule == "flag_unjudged"} == {"engine_args.revision"}
    # the draft model is other weights, named by the loading rule from the release's own facts
    assert {f.field for f in warned.findings if f.rule == "other_weights"} == {"engine_args.speculative_config.model"}
