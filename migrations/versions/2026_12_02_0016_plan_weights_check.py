"""plans.weights_check: how the plan's nodes check its weights, as asked at creation — ``{"mode": "skip",
"reason": ..., "requested_by": ...}`` for a plan signed with ``weights_check: "skip"`` (audited
``plan.weights_check_skipped``), ``{"mode": "verify"}`` otherwise; null for plans created before this revision (their
signed claims carry no ``weights_expected``: nodes check only what the manifest's files recorded)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("plans") as batch:
        batch.add_column(sa.Column("weights_check", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("plans") as batch:
        batch.drop_column("weights_check")
