"""Test helpers: real inputs from tests/fixtures (model configs) and tests/cases (launch cases)."""

from __future__ import annotations

import copy
import json
import pathlib
from functools import cache

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODELS = ROOT / "fixtures" / "models"
CASES = ROOT / "cases"
ADMIN = "test-admin-token-0123456789"  # the admin token of every test service
CASE_ONLY_KEYS = {"id", "source", "summary", "expect", "confidence", "notes"}


@cache
def _config(name: str) -> str:
    return (MODELS / name / "config.json").read_text()


def model_config(name: str) -> dict:
    """A real config.json from tests/fixtures/models/<org__name>/ (a fresh copy)."""
    return json.loads(_config(name))


def hf_quant_config(name: str) -> dict | None:
    p = MODELS / name / "hf_quant_config.json"
    return json.loads(p.read_text()) if p.exists() else None


def case_files(kind: str) -> list[pathlib.Path]:
    return sorted((CASES / kind).glob("*.json"))


def load_case(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def case_request(case: dict) -> dict:
    """The launch request of a case: the case minus its bookkeeping, fixture config inlined (as run_cases.py does)."""
    req = {k: copy.deepcopy(v) for k, v in case.items() if k not in CASE_ONLY_KEYS}
    model = dict(req["model"])
    fixture = model.pop("config_fixture", None)
    if fixture:
        model["config"] = model_config(fixture)
    req["model"] = model
    return req


def request(
    model: str,
    gpu: str = "h100-sxm-80gb",
    count: int = 8,
    nodes: int = 1,
    interconnect="nvlink",
    environment: str = "production",
    **engine_args,
) -> dict:
    """A launch request for a fixture model on catalogue GPUs."""
    return {
        "model": {"name": model, "config": model_config(model), "hf_quant_config": hf_quant_config(model)},
        "hardware": {"gpu": gpu, "count": count, "nodes": nodes, "interconnect": interconnect},
        "environment": environment,
        "engine_args": engine_args,
    }


def audit_events(client, **params) -> list[tuple[str, str]]:
    """The audit events a listing holds, as (id, kind): what was recorded, not the sealing columns (`seq`, `hash`)
    that the background sealer fills in after commit, so two listings compare equal whenever nothing was written."""
    items = client.get("/v1/audit", params={"limit": 1000, **params}).json()["items"]
    return [(e["id"], e["kind"]) for e in items]
