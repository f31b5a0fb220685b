"""Metrics, request ids, JSON logs, health and readiness."""

from __future__ import annotations

import json
import logging

from service.api.observability import JsonFormatter
from tests.support import model_config


def test_request_id_is_echoed_or_generated(client):
    r = client.get("/healthz", headers={"X-Request-ID": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    a, b = client.get("/healthz").headers["x-request-id"], client.get("/healthz").headers["x-request-id"]
    assert len(a) == 22 and a != b


def test_metrics_count_routes_verdicts_findings_fetches_and_audit(client):
    client.post("/v1/nodes", json={"name": "n1", "gpu": "a100-sxm4-80gb", "gpu_count": 4})
    client.post(
        "/v1/validate",
        json={
            "model": {"config": model_config("microsoft__Phi-3-medium-4k-instruct")},
            "hardware": {"gpu": "a100-sxm4-80gb", "count": 4},
            "engine_args": {"tensor_parallel_size": 4},
        },
    )
    text = client.get("/metrics").text
    assert 'preflight_http_requests_total{method="POST",route="/v1/nodes",status="201"}' in text
    assert 'preflight_verdicts_total{endpoint="validate",verdict="reject"}' in text
    assert 'preflight_findings_total{rule="tp_kv_heads",severity="error"}' in text
    assert 'preflight_audit_appends_total{kind="node.registered"}' in text
    assert "preflight_http_request_duration_seconds_bucket" in text


def test_readyz_reports_database_and_key(client, keys):
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json() == {"status": "ready", "database": "ok", "signing_key": keys.active_kid}


def test_json_log_lines_carry_the_request_fields():
    rec = logging.makeLogRecord(
        {
            "name": "preflight.access",
            "levelname": "INFO",
            "msg": "request",
            "request_id": "r1",
            "route": "/v1/plans",
            "status": 201,
        }
    )
    out = json.loads(JsonFormatter().format(rec))
    assert out["message"] == "request" and out["request_id"] == "r1" and out["status"] == 201


def test_access_log_has_request_id(client, caplog):
    with caplog.at_level(logging.INFO, logger="preflight.access"):
        client.get("/healthz", headers={"X-Request-ID": "log-me"})
    assert any(getattr(r, "request_id", None) == "log-me" and r.route == "/healthz" for r in caplog.records)
