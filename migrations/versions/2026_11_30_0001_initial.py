"""initial schema: nodes, tokens, manifests, plans, assignments, reports, audit events

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("gpu_id", sa.String(64), nullable=False),
        sa.Column("gpu", sa.JSON(), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("interconnect", sa.String(16), nullable=True),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_nodes"),
        sa.UniqueConstraint("name", name="uq_nodes_name"),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("node_name", sa.String(128), nullable=True),
        sa.Column("label", sa.String(256), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("revoked_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_tokens"),
        sa.UniqueConstraint("token_hash", name="uq_tokens_token_hash"),
    )
    op.create_table(
        "manifests",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("version", sa.String(128), nullable=False),
        sa.Column("uri", sa.String(2048), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("quantization_txt", sa.Text(), nullable=True),
        sa.Column("hf_quant_config", sa.JSON(), nullable=True),
        sa.Column("checkpoint", sa.JSON(), nullable=False),
        sa.Column("weights_bytes", sa.BigInteger(), nullable=True),
        sa.Column("digests", sa.JSON(), nullable=False),
        sa.Column("digest", sa.String(80), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_manifests"),
        sa.UniqueConstraint("name", "version", name="uq_manifests_name_version"),
    )
    op.create_table(
        "plans",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("manifest_id", sa.Integer(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("verdict", sa.String(8), nullable=False),
        sa.Column("findings", sa.JSON(), nullable=False),
        sa.Column("argv", sa.JSON(), nullable=False),
        sa.Column("command", sa.Text(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("budget", sa.JSON(), nullable=True),
        sa.Column("vllm_version", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_plans"),
        sa.ForeignKeyConstraint(["manifest_id"], ["manifests.id"], name="fk_plans_manifest_id_manifests"),
    )
    op.create_table(
        "assignments",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("plan_id", sa.String(36), nullable=False),
        sa.Column("node_name", sa.String(128), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("signed", sa.Text(), nullable=False),
        sa.Column("etag", sa.String(80), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("last_report", sa.String(16), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_assignments"),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], name="fk_assignments_plan_id_plans"),
        sa.UniqueConstraint("node_name", "seq", name="uq_assignments_node_seq"),
    )
    op.create_index("ix_assignments_plan_id", "assignments", ["plan_id"])
    op.create_index("ix_assignments_node_status", "assignments", ["node_name", "status"])
    op.create_table(
        "reports",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("plan_id", sa.String(36), nullable=False),
        sa.Column("node_name", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_reports"),
    )
    op.create_index("ix_reports_plan_id", "reports", ["plan_id"])
    op.create_index("ix_reports_node_name", "reports", ["node_name"])
    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("ts", TS, nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(48), nullable=False),
        sa.Column("subject", sa.String(256), nullable=False),
        sa.Column("node", sa.String(128), nullable=True),
        sa.Column("plan_id", sa.String(36), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("payload_digest", sa.String(64), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_events"),
        sa.UniqueConstraint("hash", name="uq_audit_events_hash"),
    )
    op.create_index("ix_audit_events_node_id", "audit_events", ["node", "id"])
    op.create_index("ix_audit_events_plan_id", "audit_events", ["plan_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_audit_events_plan_id", "audit_events")
    op.drop_index("ix_audit_events_node_id", "audit_events")
    op.drop_table("audit_events")
    op.drop_index("ix_reports_node_name", "reports")
    op.drop_index("ix_reports_plan_id", "reports")
    op.drop_table("reports")
    op.drop_index("ix_assignments_node_status", "assignments")
    op.drop_index("ix_assignments_plan_id", "assignments")
    op.drop_table("assignments")
    op.drop_table("plans")
    op.drop_table("manifests")
    op.drop_table("tokens")
    op.drop_table("nodes")
