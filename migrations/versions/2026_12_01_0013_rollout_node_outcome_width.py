"""Rollout node outcomes up to 32 characters: ``superseded_by_hand`` (a node planned by hand during its
wave) does not fit the 16 of 0010

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rollout_nodes") as batch:
        batch.alter_column("outcome", existing_type=sa.String(16), type_=sa.String(32), existing_nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("rollout_nodes") as batch:
        batch.alter_column("outcome", existing_type=sa.String(32), type_=sa.String(16), existing_nullable=False)
