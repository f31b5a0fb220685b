"""Print the OpenAPI document of the app (``python -m service.api.openapi > openapi/openapi.json``)."""

from __future__ import annotations

import json
import pathlib
import tempfile

from ..settings import Settings


def openapi_document() -> dict:
    """The app's OpenAPI document; built on a throw-away data dir so no key or database is touched."""
    from ..db.session import Database
    from ..signing import KeyStore
    from .app import create_app

    with tempfile.TemporaryDirectory() as tmp:
        s = Settings(data_dir=pathlib.Path(tmp), database_url=f"sqlite:///{tmp}/x.db", admin_token="x" * 32)
        app = create_app(s, db=Database(s.resolved_database_url), keys=KeyStore(s.key_dir))
        return app.openapi()


def render() -> str:
    return json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(render(), end="")
