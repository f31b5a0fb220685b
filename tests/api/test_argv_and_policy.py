"""What each environment refuses under the policy profile, over HTTP, and launches posted as an argv: POST /v1/plans
(and its dry run) and POST /v1/validate read ``argv`` as vLLM's parser does."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.domain.policy_profile import default_profile
from service.settings import Settings
from tests.conftest import ADMIN
from tests.support import model_config
from tests.support.api import register_manifest, register_node

MODEL = "meta-llama/Llama-3.1-70B"
URI = f"s3://weights/{MODEL}"
ARGS = {"tensor_parallel_size": 8, "max_model_len": 8192, "gpu_memory_utilization": 0.9}
ARGV = ["vllm", "serve", MODEL, "--tensor-parallel-size", "8", "--max-model-len", "8192", "--gpu-memory-utilization"]


def plan(**body):
    return {"manifest": f"{MODEL}@1", "nodes": ["gpu-01"], **body}


@pytest.fixture
def fleet(client):
    register_node(client)
    register_manifest(client)
    return client


@pytest.fixture
def fleet_app(db, keys):
    """A service app of other settings over the test database, with the node and manifest registered."""
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    opened = []

    def make(settings):
        client = TestClient(create_app(settings, db=db, keys=keys))
        client.__enter__()
        opened.append(client)
        client.headers["Authorization"] = f"Bearer {ADMIN}"
        register_node(client)
        register_manifest(client)
        return client

    yield make
    for client in opened:
        client.__exit__(None, None, None)


def util(client, value, environment="production", path="/v1/plans"):
    return client.post(path, json=plan(engine_args={**ARGS, "gpu_memory_utilization": value}, environment=environment))


def test_production_refuses_097_with_the_rule(fleet):
    r = util(fleet, 0.97)
    assert r.status_code == 422 and r.json()["type"].endswith("launch-rejected")
    (f,) = [f for f in r.json()["findings"] if f["severity"] == "error"]
    assert f["rule"] == "util_too_high" and f["data"]["policy"] == {"profile": "default", "action": "enforce"}
    assert r.json()["detail"].startswith("Preflight's policy (profile 'default') refuses this launch: util_too_high")
    assert {"gpu_memory_utilization": 0.9} in r.json()["alternatives"]
    assert fleet.get("/v1/plans").json()["items"] == []


def test_production_093_is_a_201_with_verdict_warn_and_the_profile_recorded(fleet):
    r = util(fleet, 0.93)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["verdict"] == "warn"
    assert [f["severity"] for f in body["findings"] if f["rule"] == "util_too_high"] == ["warning"]
    assert body["policy"] == default_profile().provenance() and body["given"] is None
    assert fleet.get(f"/v1/plans/{body['id']}").json()["policy"]["digest"] == default_profile().digest


def test_benchmark_accepts_097_with_a_warning(fleet):
    r = util(fleet, 0.97, environment="benchmark", path="/v1/plans?dry_run=true")
    assert r.status_code == 200, r.text
    assert r.json()["verdict"] == "warn" and r.json()["policy"]["name"] == "default"
    assert [f["severity"] for f in r.json()["findings"] if f["rule"] == "util_too_high"] == ["warning"]


def test_an_operator_profile_file(tmp_path, db_url, fleet_app):
    path = tmp_path / "site.toml"
    path.write_text(
        'name = "site"\n[production]\nutil_too_high = "off"\n[benchmark]\nenforce_eager_production = "enforce"\n'
    )
    client = fleet_app(Settings(data_dir=tmp_path / "var", database_url=db_url, admin_token=ADMIN, policy_file=path))
    r = util(client, 0.97)
    assert r.status_code == 201 and not [f for f in r.json()["findings"] if f["rule"] == "util_too_high"]
    assert r.json()["policy"]["name"] == "site"
    eager = client.post("/v1/plans", json=plan(engine_args={**ARGS, "enforce_eager": True}, environment="benchmark"))
    assert eager.status_code == 422 and eager.json()["findings"][0]["rule"] == "enforce_eager_production"


@pytest.mark.parametrize(
    "text,message",
    [
        (
            'name = "x"\n[production]\nutil_range = "off"\n',
            "production.util_range: is one of vLLM's own start-up checks",
        ),
        ('name = "x"\n[production]\nutil_too_high = "maybe"\n', "production.util_too_high.action: must be one of"),
    ],
)
def test_a_bad_profile_stops_the_service_naming_file_and_key(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValidationError) as exc:
        Settings(data_dir=tmp_path, policy_file=path)
    assert f"PREFLIGHT_POLICY_FILE: policy file {path}: {message}" in str(exc.value)


# -- argv -------------------------------------------------------------------------------------------------------------


def signed_argv(client, plan_id):
    return client.get(f"/v1/plans/{plan_id}").json()["argv"]


def test_the_same_launch_as_engine_args_and_as_argv(fleet):
    by_args = fleet.post("/v1/plans", json=plan(engine_args=ARGS))
    by_argv = fleet.post("/v1/plans", json=plan(argv=[*ARGV, "0.9"]))
    assert by_args.status_code == by_argv.status_code == 201, by_argv.text
    a, b = by_args.json(), by_argv.json()
    assert (a["verdict"], a["findings"]) == (b["verdict"], b["findings"])
    assert a["argv"] == b["argv"] and a["argv"][2] == URI
    assert signed_argv(fleet, a["id"]) == signed_argv(fleet, b["id"])
    assert b["given"] == {"argv": [*ARGV, "0.9"], "engine_args": ARGS}
    assert fleet.get(f"/v1/plans/{b['id']}").json()["given"]["argv"] == [*ARGV, "0.9"]
    dry = fleet.post("/v1/plans?dry_run=true", json=plan(argv=[*ARGV, "0.9"])).json()
    assert dry["argv"] == a["argv"] and dry["given"]["engine_args"] == ARGS


def test_the_manifest_uri_names_the_model_too_and_policy_applies(fleet):
    r = fleet.post("/v1/plans?dry_run=true", json=plan(argv=["vllm", "serve", URI, "-tp", "8", "--enforce-eager"]))
    assert r.status_code == 422 and r.json()["findings"][0]["rule"] == "enforce_eager_production"


def problem(r):
    assert r.status_code == 422, r.text
    body = r.json()
    return {(e["field"], e["rule"]) for e in body.get("errors", [])}, body["detail"]


def test_both_given_is_a_422_naming_argv(fleet):
    fields, _ = problem(fleet.post("/v1/plans", json=plan(argv=[*ARGV, "0.9"], engine_args=ARGS)))
    assert {f for f, _ in fields} == {"argv"}


def test_another_model_is_a_422_naming_its_element(fleet):
    fields, detail = problem(fleet.post("/v1/plans", json=plan(argv=["vllm", "serve", "Qwen/Qwen2-7B", "-tp", "8"])))
    assert fields == {("argv[2]", "argv_model")}
    assert "'Qwen/Qwen2-7B', another model than the request's" in detail
    fields, _ = problem(fleet.post("/v1/plans", json=plan(argv=["vllm", "serve", "-tp", "8", "--model", "other/m"])))
    assert fields == {("argv[4]", "argv_model")}  # the --model word


def test_unknown_flag_and_config_are_422s_naming_the_index(fleet):
    fields, detail = problem(fleet.post("/v1/plans", json=plan(argv=["vllm", "serve", MODEL, "--max-modle-len", "4"])))
    assert fields == {("argv[3]", "argv")} and "did you mean --max-model-len" in detail
    argv = ["vllm", "serve", MODEL, "--config", "/etc/vllm.yaml"]
    fields, detail = problem(fleet.post("/v1/plans?dry_run=true", json=plan(argv=argv)))
    assert fields == {("argv[3]", "argv_config")} and "the service has no such file" in detail


def test_an_abbreviation_is_accepted_with_the_warning(fleet):
    r = fleet.post(
        "/v1/plans",
        json=plan(
            argv=[
                "vllm",
                "serve",
                MODEL,
                "--tensor-parallel",
                "8",
                "--max-model-len",
                "8192",
                "--gpu-memory-utilization",
                "0.9",
            ]
        ),
    )
    assert r.status_code == 201, r.text
    (note,) = [f for f in r.json()["findings"] if f["rule"] == "argv_read"]
    assert note == {
        "rule": "argv_read",
        "severity": "warning",
        "message": "'--tensor-parallel' is read as --tensor-parallel-size (an abbreviation)",
        "remedy": None,
        "source": "vllm 0.33.0 vllm/utils/argparse_utils.py:313-513 (FlexibleArgumentParser.parse_args)",
        "field": "argv[3]",
    }
    assert (
        r.json()["verdict"] == "warn"
        and r.json()["argv"] == fleet.post("/v1/plans?dry_run=true", json=plan(engine_args=ARGS)).json()["argv"]
    )


@pytest.mark.parametrize(
    "argv,field",
    [
        (["vllm", "serve", MODEL] + ["--enforce-eager"] * 100_000, "argv"),
        (["vllm", "serve", MODEL, "--served-model-name", "x" * 100_000], "argv.4"),
        (["vllm", "serve", MODEL] + ["--served-model-name", "x" * 2000] * 40, "argv"),
        (["vllm", "serve", MODEL, "-tp", 8], "argv.4"),
        (["vllm", "serve", MODEL, None], "argv.3"),
        ("vllm serve " + MODEL, "argv"),
    ],
)
def test_hostile_argv_is_a_422(fleet, argv, field):
    fields, _ = problem(fleet.post("/v1/plans?dry_run=true", json=plan(argv=argv)))
    assert field in {f for f, _ in fields}


def test_validate_takes_an_argv(client):
    inline = {
        "model": {"config": model_config("meta-llama__Meta-Llama-3.1-70B")},
        "hardware": {"gpu": "h100-sxm-80gb", "count": 8},
    }
    by_args = client.post("/v1/validate", json={**inline, "engine_args": ARGS}).json()
    by_argv = client.post("/v1/validate", json={**inline, "argv": [*ARGV, "0.9"]}).json()
    assert by_argv["verdict"] == by_args["verdict"] and by_argv["findings"] == by_args["findings"]
    assert by_argv["argv"][2] == MODEL and by_argv["argv"][3:] == by_args["argv"][3:]
    named = {**inline, "model": {**inline["model"], "name": "other/model"}}
    fields, _ = problem(client.post("/v1/validate", json={**named, "argv": [*ARGV, "0.9"]}))
    assert fields == {("argv[2]", "argv_model")}
    fields, _ = problem(client.post("/v1/validate", json={**inline, "argv": [*ARGV, "0.9"], "engine_args": {}}))
    assert {f for f, _ in fields} == {"argv"}
    r = client.post("/v1/validate", json={**inline, "argv": [*ARGV, "0.97"]}).json()
    assert r["verdict"] == "reject" and r["policy"]["name"] == "default"


def test_validate_refuses_an_empty_model_at_its_element(client):
    """An empty MODEL would be signed as a placeholder command: a 422 at the element that gives it."""
    inline = {
        "model": {"config": model_config("meta-llama__Meta-Llama-3.1-70B")},
        "hardware": {"gpu": "h100-sxm-80gb", "count": 8},
    }
    for argv, field in (
        (["vllm", "serve", ""], "argv[2]"),
        (["vllm", "serve", "--model=", "-tp", "8"], "argv[2]"),
        (["vllm", "serve", "-tp", "8", "--model", " "], "argv[4]"),
    ):
        fields, detail = problem(client.post("/v1/validate", json={**inline, "argv": argv}))
        assert fields == {(field, "argv")} and "the model is empty" in detail, argv


def test_validate_bounds_a_list_option_at_its_element(client):
    inline = {
        "model": {"config": model_config("meta-llama__Meta-Llama-3.1-70B")},
        "hardware": {"gpu": "h100-sxm-80gb", "count": 8},
    }
    names = [f"llama-{i}" for i in range(400)]
    fields, detail = problem(
        client.post("/v1/validate", json={**inline, "argv": [*ARGV, "0.9", "--served-model-name", *names]})
    )
    assert fields == {("argv[9]", "argv")} and "400 values, more than the 64" in detail


@pytest.mark.parametrize(
    "argv",
    [
        ["vllm", "serve", MODEL, "--compilation-config", '{"mode": NaN}'],
        ["vllm", "serve", MODEL, "--kernel-config", '{"moe_backend": Infinity}'],
        ["vllm", "serve", MODEL, "--compilation-config", '{"cudagraph_capture_sizes": [1e999]}'],
        ["vllm", "serve", MODEL, "--compilation-config.mode", "1e400"],
        ["vllm", "serve", MODEL, "--compilation-config" + ".a" * 900, "1"],
    ],
)
def test_validate_answers_a_hostile_argv_with_a_422(client, argv):
    inline = {
        "model": {"config": model_config("meta-llama__Meta-Llama-3.1-70B")},
        "hardware": {"gpu": "h100-sxm-80gb", "count": 8},
    }
    r = client.post("/v1/validate", json={**inline, "argv": argv})
    assert r.status_code == 422, r.text
    assert any(f.startswith("argv") for f, _ in problem(r)[0])
