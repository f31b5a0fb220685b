"""multi-node launches: nodes.address (where the other nodes of a group reach a head), each assignment's place in
its plan's topology (group_index, rank, role, group_digest) and the plan's topology (form, groups, per-group env)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("address", sa.String(253), nullable=True))
    with op.batch_alter_table("plans") as batch:
        batch.add_column(sa.Column("topology", sa.JSON(), nullable=True))
    with op.batch_alter_table("assignments") as batch:
        batch.add_column(sa.Column("group_index", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("rank", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("role", sa.String(16), nullable=True))
        batch.add_column(sa.Column("group_digest", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("assignments") as batch:
        batch.drop_column("group_digest")
        batch.drop_column("role")
        batch.drop_column("rank")
        batch.drop_column("group_index")
    with op.batch_alter_table("plans") as batch:
        batch.drop_column("topology")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("address")
