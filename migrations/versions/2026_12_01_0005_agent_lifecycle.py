"""agent lifecycle: manifests.allow_remote_code (trust_remote_code in production needs it), assignments'
last_heartbeat_at (heartbeats update one column: no report row, no audit event)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("manifests") as batch:
        batch.add_column(sa.Column("allow_remote_code", sa.Boolean(), nullable=False, server_default=sa.false()))
    with op.batch_alter_table("assignments") as batch:
        batch.add_column(sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_reports_node_name_id", "reports", ["node_name", "id"])


def downgrade() -> None:
    op.drop_index("ix_reports_node_name_id", table_name="reports")
    with op.batch_alter_table("assignments") as batch:
        batch.drop_column("last_heartbeat_at")
    with op.batch_alter_table("manifests") as batch:
        batch.drop_column("allow_remote_code")
