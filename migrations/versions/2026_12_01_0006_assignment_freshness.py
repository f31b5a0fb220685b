"""assignments.freshness: the freshness statement signed with the plan, so the first fetches after a rollout cost
no signature (served while it is younger than the service's re-signing window; later fetches sign a new one)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("assignments") as batch:
        batch.add_column(sa.Column("freshness", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("assignments") as batch:
        batch.drop_column("freshness")
