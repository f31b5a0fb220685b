"""audit by model and time, sealed after commit (chain_seq); fetch times on assignments; idempotency keys;
KV calibration

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("audit_events") as batch:
        batch.add_column(sa.Column("model", sa.String(256), nullable=True))
        batch.add_column(sa.Column("chain_seq", sa.BigInteger(), nullable=True))
        batch.alter_column("prev_hash", existing_type=sa.String(64), nullable=True)
        batch.alter_column("hash", existing_type=sa.String(64), nullable=True)
        batch.create_unique_constraint("uq_audit_events_chain_seq", ["chain_seq"])
    with op.batch_alter_table("assignments") as batch:
        batch.add_column(sa.Column("first_fetched_at", TS, nullable=True))
        batch.add_column(sa.Column("last_fetched_at", TS, nullable=True))
        batch.add_column(sa.Column("fetch_count", sa.Integer(), nullable=False, server_default="0"))
    op.create_index("ix_audit_events_model_id", "audit_events", ["model", "id"])
    op.create_index("ix_audit_events_ts", "audit_events", ["ts"])
    op.create_index(
        "ix_audit_events_pending",
        "audit_events",
        ["id"],
        postgresql_where=sa.text("chain_seq IS NULL"),
        sqlite_where=sa.text("chain_seq IS NULL"),
    )
    op.create_table(
        "idempotency_keys",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("route", sa.String(64), nullable=False),
        sa.Column("key", sa.String(256), nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("response", sa.JSON(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_idempotency_keys"),
        sa.UniqueConstraint("route", "key", name="uq_idempotency_keys_route_key"),
    )
    op.create_table(
        "calibration",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("plan_id", sa.String(36), nullable=False),
        sa.Column("node_name", sa.String(128), nullable=False),
        sa.Column("gpu_id", sa.String(64), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("predicted_kv_tokens", sa.BigInteger(), nullable=False),
        sa.Column("actual_kv_tokens", sa.BigInteger(), nullable=False),
        sa.Column("predicted_kv_bytes", sa.BigInteger(), nullable=True),
        sa.Column("actual_kv_bytes", sa.BigInteger(), nullable=True),
        sa.Column("relative_error", sa.Float(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_calibration"),
    )
    op.create_index("ix_calibration_plan_id", "calibration", ["plan_id"])


def downgrade() -> None:
    op.drop_index("ix_calibration_plan_id", "calibration")
    op.drop_table("calibration")
    op.drop_table("idempotency_keys")
    op.drop_index("ix_audit_events_pending", "audit_events")
    op.drop_index("ix_audit_events_ts", "audit_events")
    op.drop_index("ix_audit_events_model_id", "audit_events")
    with op.batch_alter_table("assignments") as batch:
        batch.drop_column("fetch_count")
        batch.drop_column("last_fetched_at")
        batch.drop_column("first_fetched_at")
    op.execute("DELETE FROM audit_events WHERE chain_seq IS NULL")
    with op.batch_alter_table("audit_events") as batch:
        batch.drop_constraint("uq_audit_events_chain_seq", type_="unique")
        batch.alter_column("hash", existing_type=sa.String(64), nullable=False)
        batch.alter_column("prev_hash", existing_type=sa.String(64), nullable=False)
        batch.drop_column("chain_seq")
        batch.drop_column("model")
