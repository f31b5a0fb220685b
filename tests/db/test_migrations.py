"""Alembic upgrade and downgrade both work, and the migrated schema matches the models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from service.db.migrate import downgrade, upgrade
from service.db.models import Base


def test_schema_matches_models(db_url):
    engine = create_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == [], diff


def test_downgrade_then_upgrade(db_url):
    downgrade(db_url, "base")
    engine = create_engine(db_url)
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    upgrade(db_url)
    assert {"nodes", "manifests", "plans", "assignments", "reports", "audit_events", "tokens"} <= set(
        inspect(engine).get_table_names()
    )
    engine.dispose()
