"""Shared fixtures: a fresh database per test (SQLite always; PostgreSQL too when PREFLIGHT_TEST_DATABASE_URL is
set, as CI does), migrated with Alembic, and the app over it."""

from __future__ import annotations

import os
import pathlib

import pytest
from sqlalchemy import create_engine, text

from service.db.migrate import upgrade
from service.db.session import Database
from service.settings import Settings
from service.signing import KeyStore

PG_URL = os.environ.get("PREFLIGHT_TEST_DATABASE_URL")
DB_KINDS = ["sqlite"] + (["postgresql"] if PG_URL else [])
ADMIN = "test-admin-token-0123456789"


def reset_postgres(url: str) -> None:
    """Wipe the scratch database. A session an earlier test left open (a server thread cut off mid-transaction by a
    simulated outage, a pool not disposed) would hold locks the DROP waits for: every other session on this database
    is ended first, and the DROP gives up after a minute with an error instead of hanging the suite."""
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
        conn.execute(text("SET LOCAL lock_timeout = '60s'"))
        conn.execute(text("DROP SCHEMA IF EXISTS public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@pytest.fixture(params=DB_KINDS)
def db_url(request, tmp_path: pathlib.Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'preflight.db'}"
    else:
        url = PG_URL
        reset_postgres(url)
    upgrade(url)
    return url


@pytest.fixture
def settings(tmp_path: pathlib.Path, db_url: str) -> Settings:
    return Settings(data_dir=tmp_path / "var", database_url=db_url, admin_token=ADMIN)


@pytest.fixture
def keys(settings: Settings) -> KeyStore:
    return KeyStore(settings.key_dir)


@pytest.fixture
def db(settings: Settings):
    database = Database(settings.resolved_database_url)
    yield database
    database.engine.dispose()


@pytest.fixture
def client(settings: Settings, db: Database, keys: KeyStore):
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    app = create_app(settings, db=db, keys=keys)
    with TestClient(app) as c:
        c.headers["Authorization"] = f"Bearer {ADMIN}"
        yield c
