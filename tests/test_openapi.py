"""openapi/openapi.json is generated from the app and must stay in sync (regenerate: `make openapi`)."""

import json
import pathlib

from service.api.openapi import render

DOC = pathlib.Path(__file__).resolve().parents[1] / "openapi" / "openapi.json"


def test_openapi_document_is_current():
    assert DOC.read_text() == render(), "openapi/openapi.json is stale: run `make openapi`"


def test_operation_ids_are_stable_and_unique():
    doc = json.loads(DOC.read_text())
    ids = [op["operationId"] for path in doc["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids))
    assert {"createPlan", "fetchNodePlan", "registerNode", "registerManifest", "validateLaunch", "jwks"} <= set(ids)
