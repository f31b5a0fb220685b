"""`preflight audit verify` where there is no database: a line saying where it looked, exit 2 — not a traceback and
not exit 1, which means a broken or cut chain."""

from __future__ import annotations

from typer.testing import CliRunner

from service.cli import app


def test_verify_without_a_database_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFLIGHT_DATABASE_URL", raising=False)
    env = {"PREFLIGHT_DATA_DIR": str(tmp_path / "missing" / "var")}
    out = CliRunner().invoke(app, ["audit", "verify"], env=env)
    assert out.exit_code == 2, out.output
    assert "cannot read the audit log at" in out.output and "missing/var/preflight.db" in out.output
    assert "Traceback" not in out.output
