"""The operators' verbs on a rollout (service/services/rollouts/commands.py) over HTTP and through the CLI:
pause, resume, promote and abort, their reasons, and the CLI's handling of a hostile or dripping server."""

from __future__ import annotations

import re
import time

import pytest

from tests.support import ADMIN
from tests.support.rollouts import NEW, NODES, OLD


def test_a_rollout_created_paused_signs_nothing_until_resumed(fleet):
    r = fleet.rollout(paused=True)
    assert r["state"] == "paused" and r["paused_from"] == "pending" and r["judged"][0]["verdict"] in ("accept", "warn")
    assert fleet.tick() == {r["id"]: "none"} and all(fleet.assignments(n) == 1 for n in NODES)
    assert fleet.api.post(f"/v1/rollouts/{r['id']}/resume").json()["state"] == "pending"
    assert fleet.tick() == {r["id"]: "sign"}


def test_pause_resume_promote_abort(fleet):
    r = fleet.rollout()
    rid = r["id"]
    t0 = time.time()
    fleet.tick(t0)
    new_id = fleet.status(rid)["nodes"][0]["new_plan_id"]
    fleet.report("gpu-01", new_id, "running")
    fleet.tick(t0 + 1)
    assert fleet.status(rid)["state"] == "baking"
    p = fleet.api.post(f"/v1/rollouts/{rid}/pause", json={"reason": "watching the dashboards"})
    assert p.status_code == 200 and p.json()["state"] == "paused" and p.json()["paused_from"] == "baking"
    assert fleet.tick(t0 + 10_000) == {rid: "none"}  # the bake is long over, but paused: nothing signed
    assert all(fleet.assignments(n) == 1 for n in NODES[1:])
    assert fleet.api.post(f"/v1/rollouts/{rid}/promote").status_code == 409  # resume first
    assert fleet.api.post(f"/v1/rollouts/{rid}/pause").status_code == 409
    res = fleet.api.post(f"/v1/rollouts/{rid}/resume")
    assert res.status_code == 200 and res.json()["state"] == "baking"
    assert fleet.tick(time.time() + 1) == {rid: "none"}  # the bake starts over on resume
    pr = fleet.api.post(f"/v1/rollouts/{rid}/promote")
    assert pr.status_code == 200 and pr.json()["promote"] is True
    assert fleet.tick(time.time() + 2) == {rid: "sign"}  # promoted: wave 2 without waiting for the bake
    s = fleet.status(rid)
    assert s["wave"] == 1 and s["promote"] is False
    wave2 = s["waves"][1]["plan_ids"][0]
    ab = fleet.api.post(f"/v1/rollouts/{rid}/abort", json={"reason": "wrong model"})
    assert ab.status_code == 200, ab.text
    s = ab.json()
    assert s["state"] == "aborted" and s["reason"] == "aborted by admin: wrong model"
    assert {n["outcome"] for n in s["nodes"]} == {"restored"}
    assert [w["state"] for w in s["waves"]] == ["done", "aborted"]
    for n in NODES:  # every node back on max_model_len 8192, each at seq 3
        plan_id, seq, argv = fleet.current(n)
        assert seq == 3 and plan_id not in (new_id, wave2) and argv[argv.index("--max-model-len") + 1] == "8192"
    assert fleet.api.post(f"/v1/rollouts/{rid}/abort").status_code == 409
    assert fleet.tick() == {}
    kinds = [k for k, _, _ in fleet.events(rid)]
    for kind in ("rollout.paused", "rollout.resumed", "rollout.promoted", "rollout.aborted", "rollout.rolled_back"):
        assert kind in kinds
    assert kinds.count("rollout.node_restored") == 4
    paused = next(p for k, _, p in fleet.events(rid) if k == "rollout.paused")
    assert paused["reason"] == "watching the dashboards" and paused["from"] == "baking"


def test_abort_leaves_a_node_someone_planned_since(fleet):
    r = fleet.rollout()
    fleet.tick()
    manual = fleet.api.post(
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-70B@1",
            "nodes": ["gpu-01"],
            "engine_args": {**OLD, "max_model_len": 4096},
        },
    ).json()
    s = fleet.api.post(f"/v1/rollouts/{r['id']}/abort").json()
    assert s["state"] == "aborted" and s["nodes"][0]["outcome"] == "superseded_by_hand"
    assert "no longer the rollout's" in s["nodes"][0]["evidence"]["restore"]
    assert fleet.current("gpu-01")[0] == manual["id"]


def test_promote_in_pending_skips_wave_0s_bake_once(fleet):
    r = fleet.rollout()  # wave 0 bakes 60 s
    assert fleet.api.post(f"/v1/rollouts/{r['id']}/promote").status_code == 200
    again = fleet.api.post(f"/v1/rollouts/{r['id']}/promote")
    assert again.status_code == 409 and "already promoted" in again.text
    t0 = time.time()
    fleet.tick(t0)
    assert fleet.status(r["id"])["promote"] is True  # kept past wave 0's signing
    fleet.report("gpu-01", fleet.status(r["id"])["nodes"][0]["new_plan_id"], "running")
    assert fleet.tick(t0 + 1) == {r["id"]: "sign"}  # no bake
    assert [k for k, _, _ in fleet.events(r["id"])].count("rollout.promoted") == 1


def test_reasons_with_control_characters_are_refused_and_printed_escaped(fleet):
    from service import cli

    r = fleet.rollout()
    for bad in ("\x1b]0;pwned\x07", "ok\x9b31m", "abc\u202egnp.exe", "line\nbreak"):
        got = fleet.api.post(f"/v1/rollouts/{r['id']}/pause", json={"reason": bad})
        assert got.status_code == 422 and "reason" in got.text, bad
    assert fleet.status(r["id"])["state"] == "pending"
    text = cli.rollout.summary(
        {
            **fleet.status(r["id"]),
            "reason": "\x1b[2Jgone\u202e",
            "nodes": [{"node": "gpu-01", "wave": 0, "outcome": "failed", "evidence": {"reason": "x\x07"}}],
        }
    )
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert "\\x1b[2Jgone\\u202e" in text and "x\\x07" in text


def test_cli_rollout_create_status_pause_resume_promote_abort(fleet, tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from service import cli

    # the CLI's HTTP calls go to the test app
    monkeypatch.setattr(cli.common, "client", lambda server, token: fleet.api)
    run = lambda *args: CliRunner().invoke(cli.app, [*args, "--server", "http://x", "--token", ADMIN])  # noqa: E731
    spec = tmp_path / "rollout.json"
    spec.write_text(
        json.dumps(
            {
                "manifest": "meta-llama/Llama-3.1-70B@1",
                "engine_args": NEW,
                "nodes": NODES,
                "waves": [{"percent": 25, "bake_s": 600}, {"percent": 100}],
            }
        )
    )
    out = run("rollout", "create", str(spec))
    assert out.exit_code == 0, out.output
    rid = out.output.split()[1].rstrip(":")
    assert "meta-llama/Llama-3.1-70B@1" in out.output.splitlines()[0]
    assert re.search(r"^  judged 4 node\(s\) of 8 x h100-sxm-80gb: (accept|warn)", out.output, re.M), out.output
    fleet.tick()
    out = run("rollout", "status", rid)
    assert out.exit_code == 5  # still going
    assert f"rollout {rid}: waiting (wave 0), meta-llama/Llama-3.1-70B@1, failures 0 (limit 0)" in out.output
    assert "gpu-01: wave 0, pending, seq 2" in out.output and "gpu-02: wave 1, unchanged" in out.output
    assert run("rollout", "pause", rid, "--reason", "lunch").exit_code == 0
    assert "paused" in run("rollout", "status").output
    bad = run("rollout", "promote", rid)
    assert bad.exit_code == 1 and "HTTP 409" in bad.output
    assert "waiting" in run("rollout", "resume", rid).output
    assert run("rollout", "promote", rid).exit_code == 0
    out = run("rollout", "abort", rid)
    assert out.exit_code == 0 and "aborted" in out.output and "gpu-01: wave 0, restored" in out.output
    assert run("rollout", "status", rid).exit_code == 4  # scripts can tell an aborted rollout
    waited = run("rollout", "wait", rid, "--interval", "0.5")
    assert waited.exit_code == 4 and waited.output.startswith(f"rollout {rid}: aborted")
    bad_file = tmp_path / "bad.json"
    bad_file.write_text("{not json")
    assert run("rollout", "create", str(bad_file)).exit_code == 2
    refused = tmp_path / "refused.json"
    refused.write_text(
        json.dumps(
            {
                "manifest": "meta-llama/Llama-3.1-70B@1",
                "nodes": NODES,
                "engine_args": {"tensor_parallel_size": 3},
                "waves": [{"percent": 100}],
            }
        )
    )
    out = run("rollout", "create", str(refused))
    assert out.exit_code == 1 and "tp_heads_divisible" in out.output


@pytest.mark.parametrize(
    "body, code",
    [
        (b"{not json", 1),
        (b"[1, 2]", 1),
        (b'{"state": "completed"}', 1),
        (b'{"id": "x", "state": "waiting", "wave": "2"}', 5),
        (b'{"id": "x", "state": "completed", "nodes": [{"node": "a"}]}', 0),
        (b"[" * 100_000 + b"]" * 100_000, 1),
        (
            b'{"id": "x", "state": "\\u001b]0;pwned\\u0007", "failure_limit": "\\u001b[31mRED", "failures": 0,'
            b' "waves": [{"index": 0, "percent": 100, "bake_s": 0, "state": "\\u001b[2J", "nodes": []}],'
            b' "outcomes": {"ready": "\\u001b[1m"}}',
            5,
        ),
    ],
)
def test_rollout_cli_survives_a_hostile_answer(monkeypatch, body, code):
    """What a server (or something in the middle) answers is never a traceback and never reaches the terminal raw."""
    import httpx
    from typer.testing import CliRunner

    from service import cli

    transport = httpx.MockTransport(lambda req: httpx.Response(200, content=iter([body])))  # streamed, as sent
    monkeypatch.setattr(
        cli.common, "client", lambda server, token: httpx.Client(base_url="http://x", transport=transport)
    )
    for args in (["status", "x"], ["wait", "x", "--timeout", "1", "--interval", "0.5"]):
        out = CliRunner().invoke(cli.app, ["rollout", *args, "--server", "http://x", "--token", "t"])
        assert out.exit_code == code and (out.exception is None or isinstance(out.exception, SystemExit)), (
            args,
            out.output,
            out.exception,
        )
        assert "\x1b" not in out.output and "\x07" not in out.output


def test_rollout_wait_gives_up_on_a_server_that_drips(monkeypatch):
    import httpx
    from typer.testing import CliRunner

    from service import cli

    def drip():
        for _ in range(120):  # a byte every half second: a minute for the whole answer
            time.sleep(0.5)
            yield b" "

    transport = httpx.MockTransport(lambda req: httpx.Response(200, content=drip()))
    monkeypatch.setattr(
        cli.common, "client", lambda server, token: httpx.Client(base_url="http://x", transport=transport)
    )
    out = CliRunner().invoke(
        cli.app, ["rollout", "wait", "x", "--timeout", "1", "--server", "http://x", "--token", "t"]
    )
    assert isinstance(out.exception, httpx.ReadTimeout)  # given up within --timeout, not after the minute
