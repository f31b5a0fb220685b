"""rollouts, rollout_waves, rollout_nodes: staged rollouts

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "rollouts",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("wave", sa.Integer(), nullable=False),
        sa.Column("paused_from", sa.String(16), nullable=True),
        sa.Column("promote", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.Column("target", sa.JSON(), nullable=False),
        sa.Column("selector", sa.JSON(), nullable=True),
        sa.Column("waves", sa.JSON(), nullable=False),
        sa.Column("failure_limit", sa.Integer(), nullable=False),
        sa.Column("gates", sa.JSON(), nullable=False),
        sa.Column("bake_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_rollouts"),
    )
    op.create_index("ix_rollouts_state", "rollouts", ["state"])
    op.create_table(
        "rollout_waves",
        sa.Column("id", ID, primary_key=True),
        sa.Column(
            "rollout_id",
            sa.String(36),
            sa.ForeignKey("rollouts.id", name="fk_rollout_waves_rollout_id_rollouts"),
            nullable=False,
        ),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("percent", sa.Integer(), nullable=False),
        sa.Column("bake_s", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("plan_ids", sa.JSON(), nullable=False),
        sa.Column("signed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("settled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_rollout_waves"),
        sa.UniqueConstraint("rollout_id", "index", name="uq_rollout_waves_rollout_id_index"),
    )
    op.create_table(
        "rollout_nodes",
        sa.Column("id", ID, primary_key=True),
        sa.Column(
            "rollout_id",
            sa.String(36),
            sa.ForeignKey("rollouts.id", name="fk_rollout_nodes_rollout_id_rollouts"),
            nullable=False,
        ),
        sa.Column("node_name", sa.String(128), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("unit", sa.Integer(), nullable=False),
        sa.Column("wave", sa.Integer(), nullable=False),
        sa.Column("head", sa.Boolean(), nullable=False, server_default=sa.text("true")),
        sa.Column("previous_plan_id", sa.String(36), nullable=True),
        sa.Column("new_plan_id", sa.String(36), nullable=True),
        sa.Column("new_seq", sa.Integer(), nullable=True),
        sa.Column("restored_plan_id", sa.String(36), nullable=True),
        sa.Column("restored_seq", sa.Integer(), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("failed", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("signed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_rollout_nodes"),
        sa.UniqueConstraint("rollout_id", "node_name", name="uq_rollout_nodes_rollout_id_node_name"),
    )
    op.create_index("ix_rollout_nodes_node_name", "rollout_nodes", ["node_name"])


def downgrade() -> None:
    op.drop_index("ix_rollout_nodes_node_name", table_name="rollout_nodes")
    op.drop_table("rollout_nodes")
    op.drop_table("rollout_waves")
    op.drop_index("ix_rollouts_state", table_name="rollouts")
    op.drop_table("rollouts")
