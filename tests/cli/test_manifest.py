"""`preflight manifest push` on a directory it cannot read as weights: a message naming the file, never a traceback
or a hang."""

from __future__ import annotations

import os
import subprocess

from tests.support.gpus import odd, weights_dir
from tests.support.live import PREFLIGHT


def test_manifest_push_of_an_odd_directory_says_which_file(tmp_path):
    d = weights_dir(tmp_path / "m", shards=2)
    odd(d, "model-00002-of-00002.safetensors", "dangling")
    out = subprocess.run(
        [PREFLIGHT, "manifest", "push", str(d), "--server", "http://127.0.0.1:9", "--token", "t"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "model-00002-of-00002.safetensors: a dangling symlink" in out.stderr


def test_a_fifo_config_never_blocks_manifest_push(tmp_path):
    d = weights_dir(tmp_path / "m", shards=1)
    (d / "config.json").unlink()
    os.mkfifo(d / "config.json")
    out = subprocess.run(
        [PREFLIGHT, "manifest", "push", str(d), "--server", "http://127.0.0.1:9", "--token", "t"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # a blocking open would time out here
    assert out.returncode == 2 and "config.json: not a regular file" in out.stderr


def test_allow_remote_code_is_registered_with_the_manifest(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from service.cli import app, common

    sent = []

    class Client:
        def post(self, path, json):
            sent.append((path, json))
            return type("R", (), {"status_code": 201, "json": lambda self: {"id": "m"}, "is_success": True})()

    monkeypatch.setattr(common, "client", lambda server, token: Client())
    monkeypatch.setattr(common, "fail_on_problem", lambda r: None)
    d = weights_dir(tmp_path / "m", shards=1)
    args = ["manifest", "push", str(d), "--server", "http://x", "--token", "t", "--version", "2"]
    assert CliRunner().invoke(app, [*args, "--allow-remote-code"]).exit_code == 0
    assert CliRunner().invoke(app, args).exit_code == 0
    assert [(p, b["allow_remote_code"], b["version"]) for p, b in sent] == [
        ("/v1/manifests", True, "2"),
        ("/v1/manifests", False, "2"),
    ]
