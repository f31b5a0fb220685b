"""ASGI entry point for uvicorn: ``service.api.main:app`` built from the environment's settings."""

from ..settings import Settings
from .app import create_app

app = create_app(Settings())
