"""cache epochs: per-kind counters that keep each process's plan and token caches coherent

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(  # rows "kind:shard", created by the first bump (services/epochs.py)
        "cache_epochs",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("cache_epochs")
