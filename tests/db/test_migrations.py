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


def test_node_names_become_case_insensitive_and_a_clash_stops_the_upgrade(db_url):
    """0014: ``NODE-A`` and ``node-a.`` would become one node, so the upgrade fails naming both and changes nothing;
    once one is gone, every column naming a node is rewritten to lower case without the final dot, and the unique
    index on lower(name) refuses another spelling."""
    import pytest
    from sqlalchemy import text
    from sqlalchemy.exc import IntegrityError

    downgrade(db_url, "0013")
    engine = create_engine(db_url)
    insert = text(
        "INSERT INTO nodes (name, gpu_id, gpu, gpu_count, labels, created_at, updated_at) "
        "VALUES (:n, 'h100-sxm', '{}', 8, '{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
    )
    with engine.begin() as conn:
        for name in ("NODE-A", "node-a.", "Gpu-02"):
            conn.execute(insert, {"n": name})
        conn.execute(
            text(
                "INSERT INTO tokens (token_hash, role, node_name, created_at) VALUES ('h', 'agent', 'Gpu-02', CURRENT_TIMESTAMP)"
            )
        )
    with pytest.raises(RuntimeError) as exc:
        upgrade(db_url)
    assert "'node-a': 'NODE-A', 'node-a.'" in str(exc.value) and "nothing was changed" in str(exc.value)
    with engine.begin() as conn:
        assert sorted(conn.execute(text("SELECT name FROM nodes")).scalars()) == ["Gpu-02", "NODE-A", "node-a."]
        conn.execute(text("DELETE FROM nodes WHERE name = 'NODE-A'"))
    upgrade(db_url)
    with engine.begin() as conn:
        assert sorted(conn.execute(text("SELECT name FROM nodes")).scalars()) == ["gpu-02", "node-a"]
        assert conn.execute(text("SELECT node_name FROM tokens")).scalar_one() == "gpu-02"
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(insert, {"n": "GPU-02"})
    engine.dispose()
