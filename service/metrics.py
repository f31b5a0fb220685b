"""Prometheus metrics (prometheus-client). With several uvicorn workers set PROMETHEUS_MULTIPROC_DIR to a
writable empty directory so /metrics aggregates every worker; without it each worker reports its own."""

from __future__ import annotations

import os

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

REQUESTS = Counter(
    "preflight_http_requests_total", "HTTP requests by route, method and status", ["route", "method", "status"]
)
LATENCY = Histogram(
    "preflight_http_request_duration_seconds",
    "HTTP request latency by route",
    ["route", "method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
VERDICTS = Counter("preflight_verdicts_total", "Launch verdicts by endpoint", ["endpoint", "verdict"])
FINDINGS = Counter("preflight_findings_total", "Rule findings by rule code and severity", ["rule", "severity"])
AGENT_FETCHES = Counter("preflight_agent_fetches_total", "Agent plan fetches by outcome", ["outcome"])
AGENT_REPORTS = Counter("preflight_agent_reports_total", "Agent reports by status", ["status"])
AUDIT_APPENDS = Counter("preflight_audit_appends_total", "Audit events appended by kind", ["kind"])


def observe_result(endpoint: str, verdict: str, findings) -> None:
    VERDICTS.labels(endpoint, verdict).inc()
    for f in findings:
        FINDINGS.labels(f["rule"], f["severity"]).inc()


def exposition() -> tuple[bytes, str]:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST
