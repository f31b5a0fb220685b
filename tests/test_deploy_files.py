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
