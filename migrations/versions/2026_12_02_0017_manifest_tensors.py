"""manifests.tensors: the checkpoint's tensor inventory read from its safetensors headers (service/domain/tensors.py):
the layout digest over every tensor's (name, dtype, shape), counts and bytes by dtype and per file, and the
quantization format the tensors show (service/domain/tensor_format.py); null for manifests registered without one

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("manifests") as batch:
        batch.add_column(sa.Column("tensors", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("manifests") as batch:
        batch.drop_column("tensors")
