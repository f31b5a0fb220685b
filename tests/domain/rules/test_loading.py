"""write_not_allowed / path_not_allowed / secret_in_engine_args / other_weights (service/domain/rules/loading.py):
what the engine arguments would make a node load, judged in a validation from the release's own loading facts."""

from __future__ import annotations

import pytest

from service.domain.request import LaunchRequest
from service.domain.validate import validate
from tests.support import request
from tests.support.catalogue import MODEL, judged


def findings(args, environment="production"):
    req = request(MODEL, count=1, **args)
    req["environment"] = environment
    return validate(LaunchRequest.model_validate(req), alternatives=False).findings


@pytest.mark.parametrize("environment", ["production", "benchmark"])
def test_a_write_path_is_an_error_in_every_environment(environment):
    found = findings({"compilation_config": {"debug_dump_path": "/root/.ssh"}}, environment)
    [f] = [f for f in found if f.rule == "write_not_allowed"]
    assert f.field == "engine_args.compilation_config.debug_dump_path" and f.severity.value == "error"
    assert "vllm/config/vllm.py:" in f.message  # the release's line that writes there


def test_a_read_path_is_an_error_in_production_only():
    assert any(f.rule == "path_not_allowed" for f in findings({"chat_template": "/etc/shadow"}))
    assert not any(f.rule == "path_not_allowed" for f in findings({"chat_template": "/etc/shadow"}, "benchmark"))


def test_a_secret_is_refused_and_redacted_from_the_argv_shown():
    req = request(MODEL, count=1, api_key=["k-123456"])
    r = validate(LaunchRequest.model_validate(req), alternatives=False)
    assert any(f.rule == "secret_in_engine_args" and f.field == "engine_args.api_key" for f in r.errors)
    assert "k-123456" not in " ".join(r.argv) and "k-123456" not in r.command
    assert r.argv[r.argv.index("--api-key") + 1] == "<redacted>"


def test_other_weights_are_a_warning_naming_them():
    r = judged({"tokenizer": "org/other-tokenizer"})
    [f] = [f for f in r.findings if f.rule == "other_weights"]
    assert f.severity.value == "warning" and "org/other-tokenizer" in f.message
