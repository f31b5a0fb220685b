"""ASGI entry point for uvicorn: ``service.api.main:app`` built from the environment's settings."""

import os

from ..settings import Settings
from .app import create_app
from .observability import configure_logging

configure_logging(os.environ.get("PREFLIGHT_LOG_LEVEL", "INFO"))
app = create_app(Settings())
