"""Policy profiles (service/domain/policy_profile.py): the shipped profile, an operator's file read over it, and the
files refused when read (naming the file and the key)."""

from __future__ import annotations

import pytest

from service.domain.policy_profile import ProfileError, default_profile, load_profile, read_profile, rule_classes
from service.domain.request import LaunchRequest
from service.domain.validate import validate
from tests.support import request

LLAMA = "meta-llama__Llama-3.1-8B-Instruct"


def judged(profile=None, environment="production", **args):
    return validate(
        LaunchRequest.model_validate(request(LLAMA, count=1, environment=environment, **args)), policy=profile
    )


def rules(result, code):
    return [f.severity.value for f in result.findings if f.rule == code]


def test_shipped_profile_follows_operating_md():
    prod = default_profile().rules_for("production")
    assert prod["util_too_high"].as_dict() == {"action": "enforce", "warn_above": 0.9, "refuse_above": 0.95}
    assert prod["enforce_eager_production"].action == "enforce"
    operator, _, _ = rule_classes()
    assert operator == set(prod) == set(default_profile().rules_for("benchmark"))
    assert "util_range" not in operator and "chunked_prefill_disabled" not in operator  # vLLM's own


def test_production_refuses_097_warns_093_benchmark_warns_097():
    r = judged(gpu_memory_utilization=0.97)
    assert r.verdict == "reject" and rules(r, "util_too_high") == ["error"]
    assert r.alternatives[0] == {"gpu_memory_utilization": 0.9}
    assert r.policy == default_profile().provenance()
    assert rules(judged(gpu_memory_utilization=0.93), "util_too_high") == ["warning"]
    bench = judged(environment="benchmark", gpu_memory_utilization=0.97)
    assert bench.verdict == "warn" and rules(bench, "util_too_high") == ["warning"]


def test_operator_file_turns_rules_to_enforce_and_off(tmp_path):
    path = tmp_path / "strict.toml"
    path.write_text(
        'name = "strict"\n[production]\npcie_tp = "enforce"\nutil_too_high = "off"\n'
        "[benchmark.util_too_high]\naction = 'enforce'\nrefuse_above = 0.96\n"
    )
    profile = load_profile(path)
    assert profile.name == "strict" and profile.digest != default_profile().digest
    # left out: the shipped value; a string keeps the shipped thresholds
    assert profile.rules_for("production")["enforce_eager_production"].action == "enforce"
    assert profile.rules_for("benchmark")["util_too_high"].as_dict() == {
        "action": "enforce",
        "warn_above": 0.95,
        "refuse_above": 0.96,
    }
    pcie = judged(profile, gpu="a10-24gb", interconnect="pcie", tensor_parallel_size=1)
    assert rules(pcie, "pcie_tp") == []
    req = request(LLAMA, gpu="a10-24gb", count=2, interconnect="pcie", tensor_parallel_size=2)
    r = validate(LaunchRequest.model_validate(req), policy=profile)
    assert r.verdict == "reject" and rules(r, "pcie_tp") == ["error"]
    assert validate(LaunchRequest.model_validate(req)).verdict != "reject"
    off = judged(profile, gpu_memory_utilization=0.97)
    assert rules(off, "util_too_high") == [] and off.policy == {"name": "strict", "digest": profile.digest}
    assert rules(judged(profile, environment="benchmark", gpu_memory_utilization=0.97), "util_too_high") == ["error"]


@pytest.mark.parametrize(
    "text,message",
    [
        (
            'name = "x"\n[production]\nutil_range = "off"\n',
            "production.util_range: is one of vLLM's own start-up checks",
        ),
        (
            'name = "x"\n[benchmark]\nchunked_prefill_disabled = "warn"\n',
            "benchmark.chunked_prefill_disabled: is one of vLLM's own start-up checks",
        ),
        ('name = "x"\n[production]\ntp_heads_divisible = "off"\n', "is one of vLLM's own start-up checks"),
        ('name = "x"\n[production]\npath_not_allowed = "off"\n', "is one of Preflight's safety gates"),
        ('name = "x"\n[production]\nno_such_rule = "off"\n', "production.no_such_rule: is no rule"),
        ('name = "x"\n[production]\npcie_tp = "refuse"\n', "production.pcie_tp.action: must be one of"),
        (
            'name = "x"\n[production]\npcie_tp = {action = "warn", warn_above = 0.5}\n',
            "pcie_tp.warn_above: unknown key",
        ),
        (
            'name = "x"\n[production.util_too_high]\nrefuse_above = 1.5\n',
            "util_too_high.refuse_above: must be a number",
        ),
        ('name = "x"\n[production.util_too_high]\nrefuse_above = 0.8\n', "refuse_above: 0.8 is below warn_above 0.9"),
        ('name = "x"\n[staging]\npcie_tp = "off"\n', "staging: unknown key"),
        ('[production]\npcie_tp = "off"\n', "name: required"),
        ('name = "x"\nproduction = "strict"\n', "production: must be a table"),
        ("name = [", "not TOML"),
    ],
)
def test_bad_profiles_name_file_and_key(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ProfileError) as exc:
        load_profile(path)
    assert str(exc.value).startswith(f"policy file {path}: ")
    assert message in str(exc.value)


def test_unreadable_and_oversized_profiles(tmp_path):
    with pytest.raises(ProfileError, match="cannot be read"):
        load_profile(tmp_path / "missing.toml")
    with pytest.raises(ProfileError, match="larger than 65536 bytes"):
        read_profile("# " + "x" * 70_000, source="big.toml")


def test_digest_is_of_the_complete_profile(tmp_path):
    same = tmp_path / "same.toml"
    same.write_text('name = "default"\n[production]\npcie_tp = "warn"\n# a comment changes nothing\n')
    assert load_profile(same).digest == default_profile().digest
