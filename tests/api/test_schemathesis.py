"""Property-based API testing with schemathesis over every operation of the generated OpenAPI document:
no 5xx, every status code and content type documented, responses match their schema, invalid input refused.
Bounded (SCHEMATHESIS_MAX_EXAMPLES, default 15 per operation) so CI stays fast."""

from __future__ import annotations

import os
import pathlib
import tempfile

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from service.api.app import create_app
from service.db.migrate import upgrade
from service.db.session import Database
from service.settings import Settings
from service.signing import KeyStore

TOKEN = "schemathesis-admin-token-0123456789"
_tmp = pathlib.Path(tempfile.mkdtemp(prefix="preflight-st-"))
_url = f"sqlite:///{_tmp / 'st.db'}"
upgrade(_url)
_settings = Settings(data_dir=_tmp, database_url=_url, admin_token=TOKEN)
app = create_app(_settings, db=Database(_url), keys=KeyStore(_tmp / "keys"))
schema = schemathesis.openapi.from_asgi("/openapi.json", app)
MAX = int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "15"))


@schema.parametrize()
@settings(max_examples=MAX, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api(case):
    case.call_and_validate(
        headers={"Authorization": f"Bearer {TOKEN}"},
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
            negative_data_rejection,
        ],
    )
