"""The agent's own files (service/agent/files.py): read without following a symlink the service did not expect, only
as regular files, bounded, and only tokens of the service's shape."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from service.agent import files as f
from service.agent.client import AgentState, StateCorrupt
from service.agent.trust import Trust, TrustError
from service.agent.witness import read_kept
from service.services.tokens import new_secret
from tests.support.gpus import install_nvidia_smi
from tests.support.live import PREFLIGHT


def test_the_token_pattern_is_the_one_the_service_issues():
    for _ in range(200):
        assert f.TOKEN_RE.fullmatch(new_secret())


def test_a_token_file_is_read_only_as_a_regular_file_of_ours(tmp_path):
    token = new_secret()
    real = tmp_path / "real.token"
    real.write_text(token + "\n")
    assert f.read_token_file(real) == token
    # a Kubernetes Secret mount: the file is a link into ..data/ — followed; what it ends at is still checked
    (tmp_path / "..data").mkdir()
    (tmp_path / "..data" / "token").write_text(token)
    link = tmp_path / "agent.token"
    link.symlink_to(tmp_path / "..data" / "token")
    assert f.read_token_file(link) == token
    (tmp_path / "..data" / "token").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    with pytest.raises(f.UnsafeFile, match="does not hold a Preflight token"):
        f.read_token_file(link)
    fifo_link = tmp_path / "fifo.token"
    fifo_link.symlink_to(tmp_path / "fifo")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(f.UnsafeFile, match="not a regular file"):
        f.read_token_file(fifo_link)  # opening it blocking would wait for a writer for ever
    with pytest.raises(f.UnsafeFile, match="not a regular file"):
        f.read_token_file(tmp_path / "fifo")
    with pytest.raises(f.UnsafeFile, match="is a directory"):
        f.read_token_file(tmp_path)
    with pytest.raises(FileNotFoundError):
        f.read_token_file(tmp_path / "missing")
    for text, why in [
        ("x" * 5000, "more than the 4096"),
        ("hunter2", "does not hold a Preflight token"),
        ("pf_" + "a" * 42, "does not hold a Preflight token"),
        ("pf_" + "a" * 42 + "/", "does not hold a Preflight token"),
        ("", "is empty"),
    ]:
        real.write_text(text)
        with pytest.raises(f.UnsafeFile, match=why):
            f.read_token_file(real)
    real.write_bytes(b"pf_\xc3\xa9" + b"a" * 41)
    with pytest.raises(f.UnsafeFile, match="ASCII"):
        f.read_token_file(real)


def test_state_and_checkpoint_copies_are_never_read_through_a_symlink_the_trust_root_may_be_mounted(tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"last_seq": 7, "plan_id": None}))
    state = tmp_path / "state.json"
    state.symlink_to(elsewhere)
    with pytest.raises(StateCorrupt, match="symlink"):
        AgentState.load(state)
    trust = tmp_path / "trust.json"  # a ConfigMap mount: followed, and what it ends at is judged as a trust root
    trust.symlink_to(elsewhere)
    with pytest.raises(TrustError) as exc:
        Trust.load(trust)
    assert "symlink" not in str(exc.value)
    copy = tmp_path / "checkpoint.jws"
    copy.symlink_to(elsewhere)
    assert read_kept(copy, {"keys": []}) == (None, None)
    # set aside, the link itself moves (its target is untouched)
    aside = AgentState(path=state).set_aside()
    assert aside.is_symlink() and elsewhere.exists() and not os.path.lexists(state)


def test_agent_run_refuses_a_foreign_token_file_before_anything(tmp_path):
    real = tmp_path / "real.token"
    real.write_text(new_secret())
    link = tmp_path / "agent.token"
    link.symlink_to(real)
    args = ["agent", "run", "--server", "http://127.0.0.1:9", "--node", "n", "--trust", str(tmp_path / "t.json")]
    real.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")  # never sent as a bearer token, link or not
    for given in (real, link):
        out = subprocess.run([PREFLIGHT, *args, "--token-file", str(given)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "does not hold a Preflight token" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr


def test_agent_register_refuses_a_symlinked_token_file_and_changes_nothing(tmp_path):
    fake = install_nvidia_smi(tmp_path / "bin", "l4-1")
    real = tmp_path / "real.token"
    token = new_secret()
    real.write_text(token)
    link = tmp_path / "agent.token"
    link.symlink_to(real)
    out = subprocess.run(
        [
            PREFLIGHT,
            "agent",
            "register",
            "--server",
            "http://127.0.0.1:9",
            "--node",
            "n",
            "--enroll-token",
            "e",
            "--token-file",
            str(link),
            "--nvidia-smi",
            str(fake),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "is a symlink: refused" in out.stderr and "nothing changed" in out.stderr
    assert link.is_symlink() and real.read_text() == token
