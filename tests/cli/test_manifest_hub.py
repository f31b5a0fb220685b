"""`preflight manifest push --hub REPO` end to end: a Hub-compatible stand-in on 127.0.0.1 (tests/support/hub.py),
the command line, and the service (the app under test): the manifest registered is the one `manifest push DIR` of
the same checkpoint registers, named by the repository id and the commit; hostile answers end in a message naming the
file, in bounded time, never a traceback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
from typer.testing import CliRunner

from service.cli import app, common
from tests.domain.test_tensor_format import GPTQ_CONFIG, _layout, awq
from tests.support import model_config
from tests.support.hub import COMMIT, serve
from tests.support.live import PREFLIGHT
from tests.support.safetensors_files import st_bytes, write_checkpoint

LLAMA = "meta-llama__Meta-Llama-3.1-8B"
BF16 = _layout(lambda i, o: {"weight": ("BF16", [o, i])})


@pytest.fixture
def service(client, monkeypatch):
    """The CLI's HTTP client replaced by the app's test client (admin token)."""
    monkeypatch.setattr(common, "client", lambda server, token: client)
    return client


@pytest.fixture
def hub_env(monkeypatch):
    def start(files):
        ctx = serve(files)
        handler, endpoint = ctx.__enter__()
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_TOKEN", "")
        stack.append(ctx)
        return handler, endpoint

    stack: list = []
    yield start
    for ctx in stack:
        ctx.__exit__(None, None, None)


def _repo_files(tmp_path, layout, config, **extra) -> tuple[dict[str, bytes], object]:
    d = write_checkpoint(tmp_path / "tiny", {"model.safetensors": layout}, config, extra=extra or None)
    return {p.name: p.read_bytes() for p in d.iterdir()}, d


def push(*args):
    return CliRunner().invoke(app, ["manifest", "push", *args, "--server", "http://x", "--token", "t"])


def test_hub_push_registers_what_a_directory_push_does(service, hub_env, tmp_path):
    files, d = _repo_files(tmp_path, BF16, model_config(LLAMA), **{"quantization.txt": "none\n"})
    hub_env(files)
    r = push("--hub", "org/tiny")
    assert r.exit_code == 0, r.output
    assert f"org/tiny at commit {COMMIT}" in r.stderr
    assert push(str(d), "--name", "local").exit_code == 0
    got, local = service.get(f"/v1/manifests/org/tiny@{COMMIT}").json(), service.get("/v1/manifests/local@1").json()
    assert (got["name"], got["version"], got["uri"]) == ("org/tiny", COMMIT, "org/tiny")
    assert got["digests"] == {"hf_commit": COMMIT}
    for key in ("config", "quantization_txt", "hf_quant_config", "files", "tensors", "weights_bytes", "quantization"):
        assert got[key] == local[key], key
    assert got["files"]["shards"] == [{"name": "model.safetensors", "size": len(st_bytes(BF16))}]
    assert got["layout_digest"] == local["layout_digest"] and got["tensor_format"] == "none"


def test_hub_push_of_shards_without_an_index_registers_what_a_directory_push_does(service, hub_env, tmp_path):
    shards = {"model-00001-of-00002.safetensors": dict(list(BF16.items())[:3])}
    shards["model-00002-of-00002.safetensors"] = dict(list(BF16.items())[3:])
    d = write_checkpoint(tmp_path / "tiny", shards, model_config(LLAMA), index=False)
    hub_env({p.name: p.read_bytes() for p in d.iterdir()})
    r = push("--hub", "org/tiny")
    assert r.exit_code == 0, r.output
    assert push(str(d), "--name", "local").exit_code == 0
    got, local = service.get(f"/v1/manifests/org/tiny@{COMMIT}").json(), service.get("/v1/manifests/local@1").json()
    for key in ("config", "files", "tensors", "layout_digest"):
        assert got[key] == local[key], key
    assert [s["name"] for s in got["files"]["shards"]] == list(shards)


def test_hub_push_of_a_mislabeled_checkpoint_is_refused(service, hub_env, tmp_path):
    files, _ = _repo_files(tmp_path, awq(), {**model_config(LLAMA), **GPTQ_CONFIG}, **{"quantization.txt": "gptq\n"})
    hub_env(files)
    r = push("--hub", "org/tiny", "--revision", COMMIT)
    assert r.exit_code == 1 and "HTTP 422" in r.stderr
    assert "quantization.txt says gptq" in r.stderr and "model.layers.0.mlp.down_proj.qweight" in r.stderr
    assert service.get("/v1/manifests").json()["items"] == []


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"config.json": b"<html>sign in</html>"}, "org/tiny/config.json: not JSON"),
        ({"config.json": b"[1]"}, "org/tiny/config.json: not a JSON object"),
        ({}, r"org/tiny/config.json: no such file \(at revision main\)"),
        ({"config.json": b"{}", "quantization.txt": b"\xff\xfe"}, "org/tiny/quantization.txt: not UTF-8 text"),
        (
            {"config.json": b"{}", "quantization.txt": b"x" * 70000},
            "quantization.txt: 70000 bytes, more than the 65536",
        ),
        ({"config.json": b"{}"}, "org/tiny: holds no model.safetensors.index.json and no \\*.safetensors file"),
    ],
)
def test_hub_push_of_wrong_content_names_the_file(hub_env, files, message):
    hub_env(files)
    r = push("--hub", "org/tiny")
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert re.search(message, r.stderr), r.stderr


def test_hub_push_arguments():
    assert "give a DIRECTORY or --hub REPO" in push().stderr
    assert push("/x", "--hub", "org/tiny").exit_code == 2
    assert push("--hub", "org/tiny", "--hash-shards").exit_code == 2
    assert push("/x", "--revision", "main").exit_code == 2


def test_hub_push_offline_reads_the_cache(service, monkeypatch, tmp_path):
    from tests.services.test_tensor_readers import BYTES, _hf_cache

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = _hf_cache(tmp_path)
    config = cache / "models--org--tiny" / "snapshots" / ("a" * 40) / "config.json"
    config.resolve().write_text(json.dumps(model_config(LLAMA)))  # the blob it links to
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    r = push("--hub", "org/tiny", "--name", "tiny", "--version", "2")
    assert r.exit_code == 0, r.output
    got = service.get("/v1/manifests/tiny@2").json()
    assert got["digests"] == {"hf_commit": "a" * 40} and got["uri"] == "org/tiny"
    assert got["tensors"]["total_bytes"] == BYTES
    assert "not in the Hugging Face cache" in push("--hub", "org/absent").stderr


def test_a_hub_that_never_answers_ends_the_command_in_bounded_time(tmp_path):
    """The real command, in its own process: the stand-in holds config.json's answer 30 s; --hub-timeout 2."""
    with serve({"config.json": b"{}"}) as (handler, endpoint):
        handler.hostile = {"config.json": "slow"}
        env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_TOKEN": "", "HF_HUB_OFFLINE": "0"}
        started = time.monotonic()
        out = subprocess.run(
            [PREFLIGHT, "manifest", "push", "--hub", "org/tiny", "--hub-timeout", "2"]
            + ["--server", "http://127.0.0.1:9", "--token", "t"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "org/tiny/config.json: no complete answer from" in out.stderr and "in 2 s" in out.stderr
    assert time.monotonic() - started < 20
