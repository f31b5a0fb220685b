"""What the CLI loads: ``preflight check`` and the agent's commands run on machines (CI, GPU nodes) that may not have
the service's web and database stack installed, and ``check`` starts fast — it reads the one vLLM catalogue line a
request names and imports neither httpx nor the signing code. Each case runs in a fresh interpreter."""

from __future__ import annotations

import json
import pathlib
import socket
import subprocess
import sys

import pytest

from service.signing import KeyStore
from tests.support import case_files, case_request, load_case

SERVICE_STACK = ("fastapi", "starlette", "sqlalchemy", "alembic", "psycopg", "jinja2", "uvicorn")
ROOT = pathlib.Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
sys.argv = ["preflight", *json.loads(sys.argv[1])]
from service.cli import main
try:
    main()
except SystemExit as exc:
    code = exc.code
from service.domain import versions
print(json.dumps({"code": code, "modules": sorted(sys.modules),
                  "lines_read": versions._line.cache_info().currsize,
                  "all_lines_read": versions._lines.cache_info().currsize}))
"""


def loaded(*args: str) -> dict:
    """Run ``preflight ARGS`` in a fresh interpreter: its exit code, every module it imported, and how many vLLM
    catalogue lines it read."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def roots(modules: list[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def request_file(tmp_path) -> pathlib.Path:
    case = next(load_case(p) for p in case_files("handed") if load_case(p).get("vllm_version", "").startswith("0.33"))
    path = tmp_path / "request.json"
    path.write_text(json.dumps(case_request(case)))
    return path


def test_check_reads_one_catalogue_line_and_loads_neither_httpx_nor_the_service(tmp_path):
    got = loaded("check", str(request_file(tmp_path)))
    assert got["code"] in (0, 1)
    assert roots(got["modules"]).isdisjoint(SERVICE_STACK + ("httpx", "joserfc", "cryptography", "rich", "typer"))
    assert not {"service.signing", "service.settings", "service.agent.client"} & set(got["modules"])
    assert (got["lines_read"], got["all_lines_read"]) == (1, 0)


def test_check_of_a_command_line_loads_neither_httpx_nor_the_service(tmp_path):
    """``preflight check -- vllm serve …``: the argv read, the model directory resolved, nothing more loaded."""
    model = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "models" / "meta-llama__Meta-Llama-3.1-8B"
    got = loaded("check", "--json", "--gpu", "h100-sxm-80gb", "--gpus", "1", "--", "vllm", "serve", str(model))
    assert got["code"] in (0, 1)
    assert roots(got["modules"]).isdisjoint(SERVICE_STACK + ("httpx", "joserfc", "cryptography", "typer", "yaml"))
    assert (got["lines_read"], got["all_lines_read"]) == (1, 0)


def test_check_of_a_bad_file_loads_nothing_more(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    got = loaded("check", "--json", str(bad))
    assert got["code"] == 2 and roots(got["modules"]).isdisjoint(SERVICE_STACK + ("httpx",))


@pytest.mark.parametrize("args", [["agent", "--help"], ["agent", "run", "--help"], ["--help"], ["check", "--help"]])
def test_agent_help_loads_nothing_of_the_service(args):
    got = loaded(*args)
    assert got["code"] == 0 and roots(got["modules"]).isdisjoint(SERVICE_STACK)


def test_an_agent_boot_loads_nothing_of_the_service(tmp_path):
    """A whole ``agent run`` (here against a service that cannot be reached: exit 75) on a node without FastAPI,
    SQLAlchemy, Alembic, psycopg, Jinja2 or uvicorn."""
    trust = tmp_path / "trust.json"
    trust.write_text(json.dumps(KeyStore(tmp_path / "keys").jwks()))
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got = loaded(
        "agent",
        "run",
        "--server",
        f"http://127.0.0.1:{port}",
        "--node",
        "gpu-01",
        "--token",
        "t" * 43,
        "--trust",
        str(trust),
        "--state",
        str(tmp_path / "state.json"),
    )
    assert got["code"] == 75
    assert roots(got["modules"]).isdisjoint(SERVICE_STACK)
    assert got["all_lines_read"] == 0  # nor every vLLM catalogue line


def test_agent_verify_loads_nothing_of_the_service(tmp_path):
    trust = tmp_path / "trust.json"
    trust.write_text(json.dumps(KeyStore(tmp_path / "keys").jwks()))
    plan = tmp_path / "plan.jws"
    plan.write_text("not.a.plan")
    got = loaded("agent", "verify", str(plan), "--node", "gpu-01", "--trust", str(trust))
    assert got["code"] == 3 and roots(got["modules"]).isdisjoint(SERVICE_STACK)


def test_every_catalogue_file_is_named_after_its_release():
    """The catalogue knows which lines exist from the file names alone (it reads one file per request)."""
    for path in (ROOT / "service" / "data" / "vllm").glob("*.json"):
        assert json.loads(path.read_text())["vllm_version"] == path.stem, path
