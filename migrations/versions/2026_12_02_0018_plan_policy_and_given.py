"""plans.policy and plans.given: the policy profile that judged a plan ({"name", "digest"}) and, for a launch posted
as an argv, what was posted ({"argv", "engine_args"}); null for older plans

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("plans") as batch:
        batch.add_column(sa.Column("policy", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("given", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("plans") as batch:
        batch.drop_column("given")
        batch.drop_column("policy")
