"""API docs that work offline: Swagger UI served from a Python package (``fastapi-swagger`` ships the Swagger UI 5
distribution, which reads OpenAPI 3.1), never from a CDN, with the Authorize button (bearer scheme, see
openapi_doc.py). Air-gapped GPU clusters get the same page as a laptop."""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI, HTTPException
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse

ASSETS = {  # the only files served under /docs/assets/, with their media types
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon-32x32.png": "image/png",
}
PREFIX = "/docs/assets/"


def asset_dir():
    return resources.files("fastapi_swagger") / "resources"


def install(app: FastAPI) -> None:
    """``/docs`` (Swagger UI) and its assets under ``/docs/assets/``; the app must be created with ``docs_url=None``
    and ``redoc_url=None`` so that FastAPI's CDN pages are not registered."""

    @app.get("/docs", include_in_schema=False)
    def swagger_ui():
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} API",
            swagger_js_url=PREFIX + "swagger-ui-bundle.js",
            swagger_css_url=PREFIX + "swagger-ui.css",
            swagger_favicon_url=PREFIX + "favicon-32x32.png",
            # no validator badge (it would load an image from validator.swagger.io); keep the token across reloads
            swagger_ui_parameters={
                "validatorUrl": None,
                "persistAuthorization": True,
                "tryItOutEnabled": False,
                "displayRequestDuration": True,
            },
        )

    @app.get(PREFIX + "{name}", include_in_schema=False)
    def swagger_asset(name: str):
        if name not in ASSETS:
            raise HTTPException(404, "no such docs asset")
        path = asset_dir() / name
        return FileResponse(str(path), media_type=ASSETS[name], headers={"Cache-Control": "public, max-age=86400"})
