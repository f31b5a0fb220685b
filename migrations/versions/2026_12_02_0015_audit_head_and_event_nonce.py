"""The audit log's sealed head in a row of its own, and a per-event nonce bound into the MAC

``audit_head`` (one row, id 1): the chain's last sealed seq and hash, rewritten under the chain lock by the
transaction that seals, with a MAC (the audit keys), so a deleted tail shows to every process and after a restart.
The row starts at the chain's current end, unsigned (a migration has no keys); the first seal signs it.
``audit_events.nonce``: a random value written at append and covered by the event's MAC, so a copy of a row is
recognisably a copy (the sealer refuses a second row with a nonce already seen); indexed for that look-up.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

GENESIS = "0" * 64


def upgrade() -> None:
    with op.batch_alter_table("audit_events") as batch:
        batch.add_column(sa.Column("nonce", sa.String(32), nullable=True))
    op.create_index("ix_audit_events_nonce", "audit_events", ["nonce"])
    op.create_table(
        "audit_head",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("mac", sa.String(128), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_audit_head"),
        sa.CheckConstraint("id = 1", name="ck_audit_head_single_row"),
    )
    last = "SELECT {col} FROM audit_events WHERE chain_seq IS NOT NULL ORDER BY chain_seq DESC LIMIT 1"
    op.execute(
        f"INSERT INTO audit_head (id, seq, hash) SELECT 1, COALESCE(({last.format(col='chain_seq')}), 0), "
        f"COALESCE(({last.format(col='hash')}), '{GENESIS}')"
    )


def downgrade() -> None:
    op.drop_table("audit_head")
    op.drop_index("ix_audit_events_nonce", table_name="audit_events")
    with op.batch_alter_table("audit_events") as batch:
        batch.drop_column("nonce")
