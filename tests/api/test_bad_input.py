"""Bad input gets a 4xx application/problem+json naming the field, nothing half-written, never a 500."""

from __future__ import annotations

import json

import pytest

from tests.support import audit_events, model_config

LLAMA = "meta-llama__Meta-Llama-3.1-70B"


def assert_problem(r, status, field_part=None):
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["status"] == status and body["title"] and body["detail"]
    if field_part:
        fields = [e.get("field", "") for e in body.get("errors", [])] + [body.get("field", "")]
        assert any(field_part in f for f in fields), body
    return body


@pytest.mark.parametrize(
    "body,field",
    [
        ({"name": "n1", "gpu": "H900-imaginary", "gpu_count": 8}, "gpu"),
        ({"name": "n1", "gpu": "h100-sxm-80gb", "gpu_count": 0}, "gpu_count"),
        ({"name": "n1", "gpu": "h100-sxm-80gb", "gpu_count": 10**9}, "gpu_count"),
        ({"name": "n1", "gpu": "h100-sxm-80gb", "gpu_count": "eight"}, "gpu_count"),
        ({"name": "n 1/..", "gpu": "h100-sxm-80gb", "gpu_count": 8}, "name"),
        ({"name": "n1", "gpu": "h100-sxm-80gb", "gpu_count": 8, "colour": "green"}, "colour"),
        ({"name": "n1", "gpu": {"name": "Mystery GPU"}, "gpu_count": 1}, "gpu"),
        (
            {"name": "n1", "gpu": {"name": "X", "compute_capability": "banana", "memory_bytes": 2**34}, "gpu_count": 1},
            "compute_capability",
        ),
        ({"gpu": "h100-sxm-80gb", "gpu_count": 8}, "name"),
    ],
)
def test_bad_node(client, body, field):
    before = audit_events(client)
    assert_problem(client.post("/v1/nodes", json=body), 422, field)
    assert audit_events(client) == before
    assert client.get("/v1/nodes").json()["items"] == []


def test_malformed_json(client):
    r = client.post("/v1/nodes", content=b'{"name": "n1", "gpu": ', headers={"content-type": "application/json"})
    assert_problem(r, 422)


def test_oversized_body(client):
    huge = {"name": "m", "version": "1", "uri": "s3://m", "config": {"pad": "x" * (3 * 1024 * 1024)}}
    assert_problem(
        client.post("/v1/manifests", content=json.dumps(huge), headers={"content-type": "application/json"}), 413
    )


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda b: b.update(quantization_txt="turbo-quant-9000\n"), "quantization_txt"),
        (lambda b: b.update(quantization_txt="# only a comment\n"), "quantization_txt"),
        (lambda b: b["config"].pop("num_attention_heads"), "num_attention_heads"),
        (lambda b: b["config"].update(num_hidden_layers=-3), "num_hidden_layers"),
        (lambda b: b.update(config={}), "config"),
        (lambda b: b.update(weights_bytes=-1), "weights_bytes"),
        (lambda b: b.update(checkpoint={"layout": "tp_sharded"}), "checkpoint"),
        (lambda b: b.update(version=""), "version"),
    ],
)
def test_bad_manifest(client, mutate, field):
    body = {"name": "meta-llama/Llama-3.1-70B", "version": "1", "uri": "s3://w", "config": model_config(LLAMA)}
    mutate(body)
    before = audit_events(client)
    assert_problem(client.post("/v1/manifests", json=body), 422, field)
    assert audit_events(client) == before
    assert client.get("/v1/manifests").json()["items"] == []


def test_unknown_quantization_tag_names_the_accepted_ones(client):
    body = {"name": "m", "version": "1", "uri": "s3://w", "config": model_config(LLAMA), "quantization_txt": "fp9"}
    err = assert_problem(client.post("/v1/manifests", json=body), 422, "quantization_txt")["errors"][0]
    assert "awq" in err["accepted"] and "gptq" in err["accepted"]


@pytest.mark.parametrize(
    "engine_args,field",
    [
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"tensor_parallel_size": -8}, "tensor_parallel_size"),
        ({"tensor_parallel_size": 10**12}, "tensor_parallel_size"),
        ({"tensor_parallel_size": "eight"}, "tensor_parallel_size"),
        ({"max_model_len": "lots"}, "max_model_len"),
        ({"gpu_memory_utilization": "high"}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1e300}, "gpu_memory_utilization"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"hf_overrides": "{not json"}, "hf_overrides"),
    ],
)
def test_bad_engine_args_on_plan(client, engine_args, field):
    client.post("/v1/nodes", json={"name": "n1", "gpu": "h100-sxm-80gb", "gpu_count": 8})
    client.post("/v1/manifests", json={"name": "m", "version": "1", "uri": "s3://w", "config": model_config(LLAMA)})
    before = audit_events(client)
    r = client.post("/v1/plans", json={"manifest": "m", "nodes": ["n1"], "engine_args": engine_args})
    assert_problem(r, 422, field)
    assert audit_events(client) == before


def test_unknown_manifest_and_node(client):
    assert_problem(client.post("/v1/plans", json={"manifest": "nope@1", "nodes": ["n1"]}), 404, "manifest")
    client.post("/v1/manifests", json={"name": "m", "version": "1", "uri": "s3://w", "config": model_config(LLAMA)})
    assert_problem(client.post("/v1/plans", json={"manifest": "m", "nodes": ["ghost"]}), 404, "name")


def test_unsupported_version_is_a_clear_error(client):
    body = {
        "model": {"config": model_config(LLAMA)},
        "hardware": {"gpu": "h100-sxm-80gb", "count": 8},
        "vllm_version": "0.2.0",
    }
    err = assert_problem(client.post("/v1/validate", json=body), 422, "vllm_version")["errors"][0]
    assert "0.33.0" in err["accepted"]


def test_duplicate_node_is_409_and_unknown_route_is_problem(client):
    body = {"name": "n1", "gpu": "h100-sxm-80gb", "gpu_count": 8}
    assert client.post("/v1/nodes", json=body).status_code == 201
    assert_problem(client.post("/v1/nodes", json=body), 409)
    assert_problem(client.get("/v1/nothing-here"), 404)


def test_missing_token_is_401_problem(client):
    assert_problem(client.get("/v1/nodes", headers={"Authorization": ""}), 401)
    assert_problem(client.get("/v1/nodes", headers={"Authorization": "Bearer nope"}), 401)


# Found by trying to break the service (each once a 500, a 503 or a silent acceptance)
def _fleet(client):
    client.post("/v1/nodes", json={"name": "n1", "gpu": "h100-sxm-80gb", "gpu_count": 8})
    r = client.post(
        "/v1/manifests",
        json={
            "name": "meta-llama/Llama-3.1-8B",
            "version": "1",
            "uri": "s3://w",
            "config": model_config("meta-llama__Meta-Llama-3.1-8B"),
        },
    )
    assert r.status_code == 201


@pytest.mark.parametrize(
    "method,path,body",
    [
        ("GET", "/v1/manifests/99999999999999999999999", None),
        ("GET", "/v1/audit?after=99999999999999999999999", None),
        ("POST", "/v1/tokens/99999999999999999999999/revoke", None),
        ("POST", "/v1/plans", {"manifest": 999999999999999999999999, "nodes": ["n1"]}),
        ("POST", "/v1/plans", {"manifest": "meta-llama/Llama-3.1-8B", "nodes": ["n1"], "env": {"A=B": "x"}}),
        ("POST", "/v1/plans", {"manifest": "meta-llama/Llama-3.1-8B", "nodes": ["n1"], "env": {"X": "a\x00b"}}),
        (
            "POST",
            "/v1/manifests",
            {
                "name": "big",
                "version": "1",
                "uri": "s3://x",
                "config": {**model_config("meta-llama__Meta-Llama-3.1-8B"), "hidden_size": 10**30},
            },
        ),
        (
            "POST",
            "/v1/manifests",
            {
                "name": "nul\x00name",
                "version": "1",
                "uri": "s3://x",
                "config": model_config("meta-llama__Meta-Llama-3.1-8B"),
            },
        ),
        ("POST", "/v1/tokens", {"role": "auditor", "label": "x\x00"}),
    ],
)
def test_no_5xx_for_out_of_range_or_unstorable_values(client, method, path, body):
    _fleet(client)
    before = audit_events(client)
    r = client.request(method, path, json=body)
    assert 400 <= r.status_code < 500 and r.status_code != 413, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert audit_events(client) == before


@pytest.mark.parametrize(
    "raw", [b'"max_model_len": 1e309', b'"gpu_memory_utilization": NaN', b'"gpu_memory_utilization": Infinity']
)
def test_non_finite_numbers_are_refused_not_replaced_by_defaults(client, raw):
    _fleet(client)
    body = b'{"manifest": "meta-llama/Llama-3.1-8B", "nodes": ["n1"], "engine_args": {' + raw + b"}}"
    r = client.post("/v1/plans", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert client.get("/v1/nodes/n1/history").json()["items"] == []


def test_invalid_dtype_and_unknown_flag_are_rejected_not_signed(client):
    _fleet(client)
    for args, rule in (({"dtype": "float128"}, "flag_unsupported"), ({"no_such_flag": True}, "flag_unsupported")):
        r = client.post(
            "/v1/plans",
            json={
                "manifest": "meta-llama/Llama-3.1-8B",
                "nodes": ["n1"],
                "engine_args": {"max_model_len": 8192, **args},
            },
        )
        assert r.status_code == 422 and rule in {f["rule"] for f in r.json()["findings"]}


def test_agent_report_with_huge_numbers_is_refused(client):
    _fleet(client)
    token = client.post("/v1/nodes/n1/token").json()["agent_token"]
    plan = client.post(
        "/v1/plans",
        json={"manifest": "meta-llama/Llama-3.1-8B", "nodes": ["n1"], "engine_args": {"max_model_len": 8192}},
    ).json()
    r = client.post(
        "/v1/nodes/n1/reports",
        headers={"Authorization": f"Bearer {token}"},
        json={"plan_id": plan["id"], "status": "running", "details": {"x": 10**30}},
    )
    assert r.status_code == 422 and "details.x" in r.text


def test_manifest_by_hugging_face_name(client):
    _fleet(client)
    r = client.get("/v1/manifests/meta-llama/Llama-3.1-8B@1")
    assert r.status_code == 200 and r.json()["name"] == "meta-llama/Llama-3.1-8B"


def test_malformed_json_names_the_body(client):
    r = client.post("/v1/nodes", content=b'{"name": "x1", "gpu": ', headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body"


# "nonsense accepted": each was stored or judged instead of refused
@pytest.mark.parametrize("gpu_count", ["8", True, 8.0])
def test_gpu_count_must_be_a_json_integer(client, gpu_count):
    assert_problem(
        client.post("/v1/nodes", json={"name": "n1", "gpu": "h100-sxm-80gb", "gpu_count": gpu_count}), 422, "gpu_count"
    )
    client.post("/v1/nodes", json={"name": "n2", "gpu": "h100-sxm-80gb", "gpu_count": 8})
    assert_problem(client.patch("/v1/nodes/n2", json={"gpu_count": gpu_count}), 422, "gpu_count")
    body = {"model": {"config": model_config(LLAMA)}, "hardware": {"gpu": "h100-sxm-80gb", "count": gpu_count}}
    assert_problem(client.post("/v1/validate", json=body), 422, "count")


def test_empty_quantization_txt_is_refused_not_ignored(client):
    body = {"name": "m", "version": "1", "uri": "s3://w", "config": model_config(LLAMA), "quantization_txt": ""}
    assert_problem(client.post("/v1/manifests", json=body), 422, "quantization_txt")
    req = {"model": {"config": model_config(LLAMA), "quantization_txt": ""}, "hardware": {"gpu": "h100-sxm-80gb"}}
    assert_problem(client.post("/v1/validate", json=req), 422, "quantization_txt")


@pytest.mark.parametrize(
    "change,key",
    [
        ({"num_key_value_heads": 128}, "num_key_value_heads"),
        ({"max_position_embeddings": -5}, "max_position_embeddings"),
    ],
)
def test_impossible_config_values_are_refused(client, change, key):
    body = {"name": "m", "version": "1", "uri": "s3://w", "config": {**model_config(LLAMA), **change}}
    assert_problem(client.post("/v1/manifests", json=body), 422, key)
    req = {"model": {"config": body["config"]}, "hardware": {"gpu": "h100-sxm-80gb"}}
    assert_problem(client.post("/v1/validate", json=req), 422, key)


def test_report_on_a_superseded_plan_is_409_and_writes_nothing(client):
    _fleet(client)
    token = client.post("/v1/nodes/n1/token").json()["agent_token"]
    agent = {"Authorization": f"Bearer {token}"}
    first = client.post(
        "/v1/plans",
        json={"manifest": "meta-llama/Llama-3.1-8B", "nodes": ["n1"], "engine_args": {"max_model_len": 8192}},
    ).json()
    second = client.post(
        "/v1/plans",
        json={"manifest": "meta-llama/Llama-3.1-8B", "nodes": ["n1"], "engine_args": {"max_model_len": 4096}},
    ).json()
    before = audit_events(client)
    r = client.post("/v1/nodes/n1/reports", headers=agent, json={"plan_id": first["id"], "status": "running"})
    assert_problem(r, 409, "plan_id")
    assert audit_events(client) == before
    assert (
        client.post(
            "/v1/nodes/n1/reports", headers=agent, json={"plan_id": second["id"], "status": "running"}
        ).status_code
        == 201
    )
    client.post(f"/v1/plans/{second['id']}/revoke")
    assert_problem(
        client.post("/v1/nodes/n1/reports", headers=agent, json={"plan_id": second["id"], "status": "running"}),
        409,
        "plan_id",
    )


# One behaviour on both databases
def test_longest_manifest_name_and_version_are_stored_on_both_databases(client):
    body = {"name": "n" * 256, "version": "v" * 128, "uri": "s3://w", "config": model_config(LLAMA)}
    r = client.post("/v1/manifests", json=body)
    assert r.status_code == 201, r.text
    assert client.get(f"/v1/manifests/{r.json()['id']}").json()["name"] == "n" * 256


def test_agent_of_a_128_character_node_name_is_audited(client):
    name = "n" * 128
    token = client.post("/v1/nodes", json={"name": name, "gpu": "h100-sxm-80gb", "gpu_count": 8}).json()["agent_token"]
    client.post(
        "/v1/manifests",
        json={"name": "m", "version": "1", "uri": "s3://w", "config": model_config("meta-llama__Meta-Llama-3.1-8B")},
    )
    plan = client.post("/v1/plans", json={"manifest": "m@1", "nodes": [name]}).json()
    agent = {"Authorization": f"Bearer {token}"}
    assert client.get(f"/v1/nodes/{name}/plan", headers=agent).status_code == 200
    assert (
        client.post(
            f"/v1/nodes/{name}/reports", headers=agent, json={"plan_id": plan["id"], "status": "running"}
        ).status_code
        == 201
    )
    assert {"plan.fetched", "agent.running"} <= {k for _, k in audit_events(client, node=name)}


@pytest.mark.parametrize(
    "path,status",
    [
        ("/v1/tokens?after=4611686018427387903", 200),
        ("/v1/manifests?after=4611686018427387903", 200),
        ("/v1/audit?after=4611686018427387903", 200),
        ("/v1/tokens/4611686018427387903/revoke", 404),
        ("/v1/manifests/999999999999999999", 404),
        ("/v1/nodes/n1/history?before_seq=4611686018427387903", 422),
    ],
)
def test_large_ids_answer_alike_on_both_databases(client, path, status):
    _fleet(client)
    r = client.post(path) if path.endswith("/revoke") else client.get(path)
    assert r.status_code == status, r.text


def test_database_error_text_never_reaches_the_client(client, monkeypatch):
    from sqlalchemy.exc import DataError

    from service.services import manifests as manifest_service

    def broken(*_a, **_k):
        raise DataError("SELECT secret_column FROM manifests", {}, Exception('value "9" is out of range for int4'))

    monkeypatch.setattr(manifest_service, "list_manifests", broken)
    r = assert_problem(client.get("/v1/manifests"), 422)
    assert "int4" not in json.dumps(r) and "secret_column" not in json.dumps(r)


# "other"
def test_streamed_oversized_body_without_content_length_is_413(client):
    chunk = b" " * 65536

    def body():
        yield b'{"name": "m", "version": "1", "uri": "s3://m", "config": {"pad": "'
        for _ in range(40):  # 2.5 MiB > the 2 MiB default
            yield chunk
        yield b'"}}'

    r = client.post("/v1/manifests", content=body(), headers={"content-type": "application/json"})
    assert_problem(r, 413)

    def small():
        yield json.dumps({"name": "m", "version": "1", "uri": "s3://m", "config": model_config(LLAMA)}).encode()

    assert (
        client.post("/v1/manifests", content=small(), headers={"content-type": "application/json"}).status_code == 201
    )


def test_idempotency_keys_are_scoped_per_caller(client):
    _fleet(client)
    deployer = client.post("/v1/tokens", json={"role": "deployer"}).json()["token"]
    body = {"manifest": "meta-llama/Llama-3.1-8B", "nodes": ["n1"], "engine_args": {"max_model_len": 8192}}
    mine = client.post(
        "/v1/plans", json=body, headers={"Idempotency-Key": "shared", "Authorization": f"Bearer {deployer}"}
    )
    assert mine.status_code == 201
    theirs = client.post("/v1/plans", json=body, headers={"Idempotency-Key": "shared"})  # the admin, same key
    assert theirs.status_code == 201 and "Idempotent-Replayed" not in theirs.headers
    assert theirs.json()["id"] != mine.json()["id"]
    again = client.post(
        "/v1/plans", json=body, headers={"Idempotency-Key": "shared", "Authorization": f"Bearer {deployer}"}
    )
    assert again.headers.get("Idempotent-Replayed") == "true" and again.json()["id"] == mine.json()["id"]


def test_plan_env_values_are_shown_only_to_admins_and_deployers(client):
    _fleet(client)
    plan = client.post(
        "/v1/plans",
        json={"manifest": "meta-llama/Llama-3.1-8B", "nodes": ["n1"], "env": {"HF_TOKEN": "hf_supersecret"}},
    ).json()
    assert plan["env"] == {"HF_TOKEN": "hf_supersecret"}
    auditor = client.post("/v1/tokens", json={"role": "auditor"}).json()["token"]
    deployer = client.post("/v1/tokens", json={"role": "deployer"}).json()["token"]
    seen = client.get(f"/v1/plans/{plan['id']}", headers={"Authorization": f"Bearer {auditor}"})
    assert seen.status_code == 200 and "hf_supersecret" not in seen.text, seen.text
    assert seen.json()["env"] == {"HF_TOKEN": "<redacted>"} and seen.json()["signed"] is None
    full = client.get(f"/v1/plans/{plan['id']}", headers={"Authorization": f"Bearer {deployer}"}).json()
    assert full["env"] == {"HF_TOKEN": "hf_supersecret"} and full["signed"]
    for path in (f"/v1/plans/{plan['id']}/placements", "/v1/nodes/n1/history", "/v1/audit"):
        assert "hf_supersecret" not in client.get(path, headers={"Authorization": f"Bearer {auditor}"}).text, path
