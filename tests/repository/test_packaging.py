"""The node install: the wheel built from this tree, installed with its base dependencies only (what a GPU node
gets from ``pip install preflight``) into a fresh virtual environment, runs the agent's commands and ``preflight
check`` without any of the service's web or database stack. Pins come from uv.lock (``uv export``), so this is the
install the lock describes; uv's cache makes the second run offline."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

ROOT = pathlib.Path(__file__).resolve().parents[2]
SERVER_STACK = ("fastapi", "starlette", "sqlalchemy", "alembic", "psycopg", "jinja2", "uvicorn", "itsdangerous")
LLAMA_70B = ROOT / "tests" / "fixtures" / "models" / "meta-llama__Meta-Llama-3.1-70B" / "config.json"


def _uv() -> str:
    found = shutil.which("uv", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("uv")
    assert found, "uv is not installed (make install puts it in .venv/bin)"
    return found


def _run(*argv: str | os.PathLike[str], cwd: pathlib.Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "UV_PROJECT_ENVIRONMENT")}
    return subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def node_venv(tmp_path_factory) -> pathlib.Path:
    """A fresh venv holding the built wheel and the lock's base dependencies, nothing else."""
    work = tmp_path_factory.mktemp("node")
    uv = _uv()
    # setuptools reuses ./build/lib: files a stale build left there would be shipped whatever package-data says
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    built = _run(uv, "build", "--wheel", "--out-dir", work / "dist", ROOT, cwd=work)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (work / "dist").glob("preflight-*.whl")
    pins = _run(
        uv,
        "export",
        "--frozen",
        "--no-dev",
        "--no-emit-project",
        "--no-hashes",
        "--format",
        "requirements-txt",
        "--project",
        ROOT,
        cwd=work,
    )
    assert pins.returncode == 0, pins.stderr[-2000:]
    (work / "base.txt").write_text(pins.stdout)
    venv = work / "venv"
    for step in (
        (uv, "venv", "--python", sys.executable, venv),
        (uv, "pip", "install", "--python", venv / "bin" / "python", "-r", work / "base.txt", wheel),
    ):
        done = _run(*step, cwd=work)
        assert done.returncode == 0, done.stderr[-2000:]
    return venv


def test_base_install_has_no_server_stack(node_venv):
    probe = (
        f"import importlib.util, json; print(json.dumps([m for m in {SERVER_STACK!r} if importlib.util.find_spec(m)]))"
    )
    out = _run(node_venv / "bin" / "python", "-c", probe, cwd=node_venv)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_agent_commands_run_from_the_base_install(node_venv):
    for argv in (("agent", "--help"), ("agent", "run", "--help")):
        out = _run(node_venv / "bin" / "preflight", *argv, cwd=node_venv)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "Usage: preflight agent" in out.stdout


def test_check_rejects_a_launch_from_the_base_install(node_venv, tmp_path):
    """Llama 3.1 70B has 64 attention heads: tensor_parallel_size 3 is refused with vLLM's own reason, from the
    catalogue data packaged in the wheel (the working directory holds no source tree)."""
    request = {
        "model": {
            "name": "meta-llama/Llama-3.1-70B",
            "uri": "s3://weights/meta-llama/Llama-3.1-70B",
            "config": json.loads(LLAMA_70B.read_text()),
        },
        "hardware": {"gpu": "h100-sxm-80gb", "count": 3, "nodes": 1, "interconnect": "nvlink"},
        "environment": "production",
        "engine_args": {"tensor_parallel_size": 3, "max_model_len": 8192},
    }
    path = tmp_path / "tp3.json"
    path.write_text(json.dumps(request))
    out = _run(node_venv / "bin" / "preflight", "check", "--json", path, cwd=tmp_path)
    assert out.returncode == 1, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["verdict"] == "reject"
    heads = next(f for f in got["findings"] if f["rule"] == "tp_heads_divisible")
    assert heads["data"] == {"num_attention_heads": 64}
    assert heads["remedy"] == {"tensor_parallel_size": [1, 2]}
    assert got["vllm_version"] == "0.33.0"


def test_the_wheel_ships_every_data_file(node_venv):
    """Every file under service/data is in the installed package: a catalogue side file left out (parser names,
    Transformers classes, check lines, the policy profile) would silently change verdicts on a node."""
    site = _run(
        node_venv / "bin" / "python",
        "-c",
        "import service, pathlib; print(pathlib.Path(service.__file__).parent)",
        cwd=node_venv,
    )
    installed = pathlib.Path(site.stdout.strip()) / "data"
    tree = ROOT / "service" / "data"
    wanted = {p.relative_to(tree) for p in tree.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    shipped = {p.relative_to(installed) for p in installed.rglob("*") if p.is_file()}
    assert wanted - shipped == set()
