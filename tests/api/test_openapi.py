"""openapi/openapi.json is generated from the app and must stay in sync (regenerate: `make openapi`)."""

import json
import pathlib

from service.api.openapi import render

DOC = pathlib.Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"


def test_openapi_document_is_current():
    assert DOC.read_text() == render(), "openapi/openapi.json is stale: run `make openapi`"


def test_operation_ids_are_stable_and_unique():
    doc = json.loads(DOC.read_text())
    ids = [op["operationId"] for path in doc["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids))
    assert {"createPlan", "fetchNodePlan", "registerNode", "registerManifest", "validateLaunch", "jwks"} <= set(ids)


def test_every_operation_documents_its_errors_as_problem_json():
    doc = json.loads(DOC.read_text())
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            codes = set(op["responses"])
            assert "503" in codes, (path, method)
            if op["operationId"] not in {"healthz", "readyz", "jwks", "keysets", "metrics"}:
                assert {"401", "403"} <= codes, (path, method)
            if method in ("post", "patch"):
                assert {"413", "422"} <= codes, (path, method)
            for code, resp in op["responses"].items():
                if code.startswith(("4", "5")):
                    assert "application/problem+json" in resp["content"], (path, method, code)


def test_request_examples_come_from_a_real_config():
    doc = json.loads(DOC.read_text())
    ex = doc["paths"]["/v1/validate"]["post"]["requestBody"]["content"]["application/json"]["examples"]
    assert ex["phi3-tp4-rejected"]["value"]["model"]["config"]["num_key_value_heads"] == 10


def test_request_examples_reach_the_verdicts_their_summaries_claim():
    from service.api.openapi_doc import request_examples
    from service.domain.request import LaunchRequest
    from service.domain.validate import validate

    ex = request_examples()["validateLaunch"]
    assert validate(LaunchRequest.model_validate(ex["phi3-tp4-rejected"]["value"])).verdict == "reject"
    ok = validate(LaunchRequest.model_validate(ex["phi3-tp2"]["value"]))
    assert ok.verdict != "reject" and ok.recommendations


def test_every_operation_and_schema_field_has_a_description():
    """The API documents itself — every operation and every field of every schema (request bodies, the
    problem document) says what it is."""
    import json
    import pathlib

    doc = json.loads((pathlib.Path(__file__).resolve().parents[2] / "openapi" / "openapi.json").read_text())
    bare = [
        f"{name}.{field}"
        for name, schema in doc["components"]["schemas"].items()
        for field, spec in (schema.get("properties") or {}).items()
        if not spec.get("description")
    ]
    assert bare == []
    undocumented = [
        f"{method.upper()} {path}"
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        if not (op.get("description") or op.get("summary"))
    ]
    assert undocumented == []


def test_every_success_body_has_a_schema():
    """Every 2xx response that has a body describes it with a real schema (a model, or a typed string for the
    signed plan, the metrics and the export), never ``{}``."""
    doc = json.loads(DOC.read_text())
    bare = [
        f"{method.upper()} {path} {code} {media}"
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        for code, resp in op["responses"].items()
        if code.startswith("2")
        for media, content in (resp.get("content") or {}).items()
        if not content.get("schema")
    ]
    assert bare == []
    json_2xx = [
        (path, method)
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        if any(
            code.startswith("2") and "application/json" in (resp.get("content") or {})
            for code, resp in op["responses"].items()
        )
    ]
    assert len(json_2xx) == 43  # every operation but the signed plan (jose), the metrics and the export


def test_every_json_route_declares_its_response_model(client):
    from fastapi.routing import APIRoute

    routes = [r for r in client.app.routes if isinstance(r, APIRoute) and r.include_in_schema]
    undeclared = [
        r.operation_id
        for r in routes
        if r.response_model is None and r.operation_id not in {"fetchNodePlan", "metrics", "exportAudit"}
    ]
    assert undeclared == []
