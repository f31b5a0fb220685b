"""No Docker engine runs here: the Dockerfile and docker-compose.yml are checked statically."""

from __future__ import annotations

import pathlib
import re

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_dockerfile_is_multistage_nonroot_with_healthcheck():
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+\S+(?:\s+AS\s+(\w+))?", text, flags=re.M | re.I)
    assert len(stages) >= 2
    assert re.search(r"^USER\s+(?!root)\S+", text, flags=re.M)
    assert "HEALTHCHECK" in text and "/readyz" in text
    for src in re.findall(r"^COPY\s+(?!--from)(\S+)", text, flags=re.M):
        assert (ROOT / src).exists(), f"Dockerfile copies missing {src}"


def test_compose_has_postgres_migration_job_and_api():
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = doc["services"]
    assert set(services) >= {"db", "migrate", "api"}
    assert services["db"]["image"].startswith("postgres")
    assert services["migrate"]["depends_on"]["db"]["condition"] == "service_healthy"
    assert services["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    env = services["api"]["environment"]
    assert env["PREFLIGHT_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert env["PREFLIGHT_ENV"] == "production"
    assert "preflight migrate" in " ".join(services["migrate"]["command"])
    assert "--workers" in (ROOT / "Dockerfile").read_text()


def test_agent_unit_restarts_always_pins_trust_and_its_command_parses():
    import configparser
    import shlex

    import typer.main

    from service.cli import app

    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(ROOT / "deploy" / "preflight-agent.service")
    svc = unit["Service"]
    assert svc["Restart"] == "always" and svc["KillMode"] == "mixed" and unit["Unit"]["StartLimitIntervalSec"] == "0"
    argv = shlex.split(svc["ExecStart"])
    assert argv[0].endswith("/preflight") and argv[1:3] == ["agent", "run"]
    assert "--trust" in argv and "--exec" in argv and "--wait" not in argv
    cmd = typer.main.get_command(app)
    ctx = cmd.make_context("preflight", argv[1:] + ["--server", "http://x", "--node", "n", "--token", "t"])
    sub = cmd.get_command(ctx, "agent")
    run = sub.get_command(ctx, "run")
    params = run.make_context("run", argv[3:] + ["--server", "http://x", "--node", "n", "--token", "t"]).params
    assert str(params["trust"]) == "/var/lib/preflight-agent/trust.json" and params["print_only"] is False
