"""The tuning loop: metric_windows — the windows an agent samples from vLLM's /metrics (gauges, counter
deltas, P99s), a bounded number per node —, and plans.tuning: the tuning memo a plan made by the loop carries (its
state, the last level that held, the first that failed, the knee, the SLO, auto_apply)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "metric_windows",
        sa.Column("id", ID, primary_key=True),
        sa.Column("node_name", sa.String(128), nullable=False),
        sa.Column("plan_id", sa.String(36), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("window_s", sa.Float(), nullable=False),
        sa.Column("running", sa.Float(), nullable=False),
        sa.Column("waiting", sa.Float(), nullable=False),
        sa.Column("kv_usage", sa.Float(), nullable=False),
        sa.Column("preemptions", sa.Float(), nullable=False),
        sa.Column("ttft_p99_s", sa.Float(), nullable=True),
        sa.Column("e2e_p99_s", sa.Float(), nullable=True),
        sa.Column("gen_tokens_per_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_metric_windows_node_name_id", "metric_windows", ["node_name", "id"])
    with op.batch_alter_table("plans") as batch:
        batch.add_column(sa.Column("tuning", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("plans") as batch:
        batch.drop_column("tuning")
    op.drop_index("ix_metric_windows_node_name_id", table_name="metric_windows")
    op.drop_table("metric_windows")
