"""Node names are case-insensitive and never end with a dot: existing names (and every column naming a node) are
rewritten to lower(rtrim(name, '.')), and a unique index on lower(name) keeps ``NODE-A``, ``node-a`` and ``node-a.``
one node. Two existing nodes that become one name make the upgrade fail, naming them, before anything is changed
(rename one in the database, then upgrade again). The audit log is not rewritten (it is hash-chained): its events keep the
spelling of their time.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

CANONICAL = "lower(rtrim({c}, '.'))"
# every column that holds a node's name (the audit log's ``node`` excepted: see above)
NAME_COLUMNS = (
    ("nodes", "name"),
    ("tokens", "node_name"),
    ("assignments", "node_name"),
    ("reports", "node_name"),
    ("metric_windows", "node_name"),
    ("calibration", "node_name"),
    ("rollout_nodes", "node_name"),
)


def upgrade() -> None:
    conn = op.get_bind()
    clashes = conn.execute(
        sa.text(
            f"SELECT {CANONICAL.format(c='name')} AS canonical, name FROM nodes WHERE {CANONICAL.format(c='name')} IN "
            f"(SELECT {CANONICAL.format(c='name')} FROM nodes GROUP BY {CANONICAL.format(c='name')} "
            f"HAVING count(*) > 1) ORDER BY 1, 2"
        )
    ).all()
    if clashes:
        groups: dict[str, list[str]] = {}
        for canonical, name in clashes:
            groups.setdefault(canonical, []).append(name)
        listed = "; ".join(f"{c!r}: {', '.join(repr(n) for n in names)}" for c, names in groups.items())
        raise RuntimeError(
            "node names are now case-insensitive without a final dot, and these registered nodes would become one: "
            f"{listed}. Rename all but one of each in the database (and every row naming it), then migrate again; "
            "nothing was changed."
        )
    for table, column in NAME_COLUMNS:
        canonical = CANONICAL.format(c=column)
        conn.execute(sa.text(f"UPDATE {table} SET {column} = {canonical} WHERE {column} <> {canonical}"))
    op.create_index("ix_nodes_lower_name", "nodes", [sa.text("lower(name)")], unique=True)


def downgrade() -> None:
    op.drop_index("ix_nodes_lower_name", table_name="nodes")
