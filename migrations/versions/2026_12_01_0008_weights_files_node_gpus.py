"""manifests.files: the weights files a launch depends on (config.json digest, quantization tag, shards with sizes
and optional digests), checked by the agent before vLLM starts; nodes.gpus: each GPU as nvidia-smi last reported it
(`preflight agent register`, or the agent after inventory drift)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("manifests") as batch:
        batch.add_column(sa.Column("files", sa.JSON(), nullable=True))
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("gpus", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("gpus")
    with op.batch_alter_table("manifests") as batch:
        batch.drop_column("files")
