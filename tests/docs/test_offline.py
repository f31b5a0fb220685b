"""Docs that work offline: /docs and every asset it loads come from the service itself (a Python package, no CDN),
with the Authorize button (bearer scheme) and a description on every operation."""

from __future__ import annotations

from service.api.openapi_doc import PUBLIC
from tests.support.pages import assert_page_is_local


def test_docs_page_and_assets_are_served_locally(client):
    r = client.get("/docs")
    assert r.status_code == 200 and "SwaggerUIBundle" in r.text
    assert "cdn.jsdelivr" not in r.text and "fastapi.tiangolo.com" not in r.text and "unpkg" not in r.text
    seen = assert_page_is_local(client, "/docs")
    assert {"/docs/assets/swagger-ui-bundle.js", "/docs/assets/swagger-ui.css"} <= seen
    js = client.get("/docs/assets/swagger-ui-bundle.js")
    assert js.headers["content-type"].startswith("text/javascript") and len(js.content) > 500_000
    assert '"validatorUrl": null' in r.text  # no badge image from validator.swagger.io
    assert client.get("/redoc").status_code == 404  # FastAPI's ReDoc page loads from a CDN: not offered
    assert client.get("/docs/assets/../app.py").status_code == 404
    assert client.get("/docs/assets/__init__.py").status_code == 404


def test_openapi_has_bearer_scheme_and_descriptions(client):
    doc = client.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": doc["components"]["securitySchemes"]["bearer"]["description"],
    }
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op.get("description", "").strip(), f"{method} {path} ({op['operationId']}) has no description"
            if op["operationId"] in PUBLIC:
                assert "security" not in op
            else:
                assert op["security"] == [{"bearer": []}], op["operationId"]
