"""64-bit ids, wider audit actor/subject, signed audit checkpoints

- every surrogate key (and plans.manifest_id) becomes BIGINT on PostgreSQL, with its sequence ``AS bigint``: the API
  accepts ids up to 2^62 (``?after=``, ``/v1/tokens/{id}``), which an int4 column refused with a database error.
  SQLite's INTEGER PRIMARY KEY is already a 64-bit rowid and stays as it is;
- audit_events.actor 128 → 256 ("agent:" + a 128-character node name) and subject 256 → 512
  ("manifest:" + name (≤ 256) + "@" + version (≤ 128)), so every name the API accepts is stored on both databases;
- audit_events.mac: the per-event MAC the service writes (a row without a valid one is never sealed);
- audit_checkpoints: the signed checkpoints the sealer makes (service/audit.py).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
ID_TABLES = (
    "nodes",
    "tokens",
    "manifests",
    "assignments",
    "reports",
    "audit_events",
    "idempotency_keys",
    "calibration",
)


def upgrade() -> None:
    pg = op.get_bind().dialect.name == "postgresql"
    if pg:
        for table in ID_TABLES:
            op.alter_column(table, "id", type_=sa.BigInteger(), existing_type=sa.Integer(), existing_nullable=False)
            op.execute(f"ALTER SEQUENCE IF EXISTS {table}_id_seq AS bigint")
        op.alter_column(
            "plans", "manifest_id", type_=sa.BigInteger(), existing_type=sa.Integer(), existing_nullable=False
        )
        op.alter_column(
            "audit_events", "actor", type_=sa.String(256), existing_type=sa.String(128), existing_nullable=False
        )
        op.alter_column(
            "audit_events", "subject", type_=sa.String(512), existing_type=sa.String(256), existing_nullable=False
        )
    else:
        with op.batch_alter_table("audit_events") as batch:
            batch.alter_column("actor", type_=sa.String(256), existing_type=sa.String(128), existing_nullable=False)
            batch.alter_column("subject", type_=sa.String(512), existing_type=sa.String(256), existing_nullable=False)
    with op.batch_alter_table("audit_events") as batch:
        batch.add_column(sa.Column("mac", sa.String(96), nullable=True))
    op.create_table(
        "audit_checkpoints",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("head", sa.String(64), nullable=False),
        sa.Column("ids_digest", sa.String(64), nullable=False),
        sa.Column("kid", sa.String(128), nullable=False),
        sa.Column("signed", sa.Text(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_checkpoints"),
        sa.UniqueConstraint("last_seq", name="uq_audit_checkpoints_last_seq"),
    )


def downgrade() -> None:
    op.drop_table("audit_checkpoints")
    with op.batch_alter_table("audit_events") as batch:
        batch.drop_column("mac")
    pg = op.get_bind().dialect.name == "postgresql"
    if pg:
        op.alter_column(
            "audit_events", "subject", type_=sa.String(256), existing_type=sa.String(512), existing_nullable=False
        )
        op.alter_column(
            "audit_events", "actor", type_=sa.String(128), existing_type=sa.String(256), existing_nullable=False
        )
        op.alter_column(
            "plans", "manifest_id", type_=sa.Integer(), existing_type=sa.BigInteger(), existing_nullable=False
        )
        for table in ID_TABLES:
            op.execute(f"ALTER SEQUENCE IF EXISTS {table}_id_seq AS integer")
            op.alter_column(table, "id", type_=sa.Integer(), existing_type=sa.BigInteger(), existing_nullable=False)
    else:
        with op.batch_alter_table("audit_events") as batch:
            batch.alter_column("subject", type_=sa.String(256), existing_type=sa.String(512), existing_nullable=False)
            batch.alter_column("actor", type_=sa.String(128), existing_type=sa.String(256), existing_nullable=False)
