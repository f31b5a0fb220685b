"""Run the Alembic migrations programmatically (``preflight migrate``, tests, ``make run``)."""

from __future__ import annotations

import pathlib

from alembic import command
from alembic.config import Config

SOURCE_ROOT = pathlib.Path(__file__).resolve().parents[2]


def project_root() -> pathlib.Path:
    """The folder holding alembic.ini and migrations/: the source tree (editable install), else the working
    directory (the container image puts them in /app)."""
    for root in (SOURCE_ROOT, pathlib.Path.cwd()):
        if (root / "alembic.ini").is_file() and (root / "migrations").is_dir():
            return root
    raise FileNotFoundError("alembic.ini and migrations/ not found next to the package or in the working directory")


def alembic_config(url: str) -> Config:
    root = project_root()
    cfg = Config(str(root / "alembic.ini"))
    cfg.set_main_option("script_location", str(root / "migrations"))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)
