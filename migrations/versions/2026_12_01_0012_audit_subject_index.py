"""The audit log filtered by subject (``GET /v1/audit?subject=rollout:<id>``: every transition of one rollout, one
manifest's history): an index on (subject, id), so the filter never scans the chain

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_audit_events_subject_id", "audit_events", ["subject", "id"])


def downgrade() -> None:
    op.drop_index("ix_audit_events_subject_id", table_name="audit_events")
