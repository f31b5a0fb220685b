"""Which config ran where: history, placements, audit filters and export, signed checkpoints, idempotency, If-Match."""

from __future__ import annotations

import csv
import io
import json

from typer.testing import CliRunner

from service.cli import app as cli
from tests.support import model_config

runner = CliRunner()


def fleet(client, nodes=("gpu-17", "gpu-18")):
    tokens = {}
    for n in nodes:
        tokens[n] = client.post(
            "/v1/nodes", json={"name": n, "gpu": "h100-sxm-80gb", "gpu_count": 8, "interconnect": "nvlink"}
        ).json()["agent_token"]
    for fixture, name in (
        ("meta-llama__Meta-Llama-3.1-70B", "llama-70b"),
        ("meta-llama__Meta-Llama-3.1-8B", "llama-8b"),
    ):
        assert (
            client.post(
                "/v1/manifests",
                json={"name": name, "version": "1", "uri": f"s3://{name}", "config": model_config(fixture)},
            ).status_code
            == 201
        )
    return tokens


def plan(client, manifest, nodes, **engine_args):
    r = client.post(
        "/v1/plans",
        json={"manifest": manifest, "nodes": list(nodes), "engine_args": {"max_model_len": 8192, **engine_args}},
    )
    assert r.status_code == 201, r.text
    return r.json()


def test_node_history_answers_which_config_ran_and_who_approved_it(client):
    tokens = fleet(client)
    deployer = client.post("/v1/tokens", json={"role": "deployer", "label": "ci"}).json()["token"]
    first = plan(client, "llama-70b", ["gpu-17"], tensor_parallel_size=8)
    second = client.post(
        "/v1/plans",
        headers={"Authorization": f"Bearer {deployer}"},
        json={"manifest": "llama-8b", "nodes": ["gpu-17"], "engine_args": {"max_model_len": 8192}},
    ).json()
    agent = {"Authorization": f"Bearer {tokens['gpu-17']}"}
    client.get("/v1/nodes/gpu-17/plan", headers=agent)
    client.post("/v1/nodes/gpu-17/reports", headers=agent, json={"plan_id": second["id"], "status": "started"})
    client.post("/v1/nodes/gpu-17/reports", headers=agent, json={"plan_id": second["id"], "status": "running"})
    items = client.get("/v1/nodes/gpu-17/history").json()["items"]
    assert [i["plan_id"] for i in items] == [second["id"], first["id"]]
    latest, older = items
    assert latest["manifest"]["name"] == "llama-8b" and latest["approved_by"].startswith("deployer:")
    assert latest["fetches"] == 1 and latest["started_at"] and latest["running_at"] and not latest["failed_at"]
    assert latest["last_report"]["status"] == "running" and latest["argv"] == second["argv"]
    assert older["assignment_status"] == "superseded" and older["fetches"] == 0
    placements = client.get(f"/v1/plans/{second['id']}/placements").json()
    assert [p["node"] for p in placements["placements"]] == ["gpu-17"]


def test_audit_filters_by_model_node_plan_and_time_with_cursor(client):
    fleet(client)
    p70 = plan(client, "llama-70b", ["gpu-17"], tensor_parallel_size=8)
    plan(client, "llama-8b", ["gpu-18"])
    by_model = client.get("/v1/audit", params={"model": "llama-70b"}).json()["items"]
    assert {e["kind"] for e in by_model} == {"manifest.registered", "plan.created"}
    assert all(e["model"] == "llama-70b" for e in by_model)
    assert [e["plan_id"] for e in client.get("/v1/audit", params={"plan": p70["id"]}).json()["items"]] == [p70["id"]]
    everything = client.get("/v1/audit", params={"limit": 1000}).json()["items"]
    page1 = client.get("/v1/audit", params={"limit": 3}).json()
    page2 = client.get("/v1/audit", params={"limit": 3, "after": page1["next"]}).json()
    assert [e["id"] for e in page1["items"] + page2["items"]] == [e["id"] for e in everything[:6]]
    mid = everything[3]["ts"]
    since = client.get("/v1/audit", params={"since": mid, "limit": 1000}).json()["items"]
    until = client.get("/v1/audit", params={"until": mid, "limit": 1000}).json()["items"]
    assert len(since) + len(until) == len(everything) and since[0]["ts"] >= mid


def test_audit_filters_by_subject(client):
    fleet(client)
    p70 = plan(client, "llama-70b", ["gpu-17"], tensor_parallel_size=8)
    plan(client, "llama-8b", ["gpu-18"])
    mine = client.get("/v1/audit", params={"subject": f"plan:{p70['id']}"}).json()["items"]
    assert [e["kind"] for e in mine] == ["plan.created"] and mine[0]["plan_id"] == p70["id"]
    manifest = client.get("/v1/audit", params={"subject": "manifest:llama-8b@1"}).json()["items"]
    assert [e["kind"] for e in manifest] == ["manifest.registered"]
    assert client.get("/v1/audit", params={"subject": "rollout:nope"}).json()["items"] == []
    exported = client.get("/v1/audit/export", params={"subject": f"plan:{p70['id']}"}).text.splitlines()
    assert [json.loads(line)["kind"] for line in exported] == ["plan.created"]
    r = client.get("/v1/audit", params={"subject": "x" * 513})
    assert r.status_code == 422 and "subject" in r.text


def test_export_jsonl_and_csv_match_the_log(client):
    fleet(client)
    plan(client, "llama-8b", ["gpu-18"])
    events = client.get("/v1/audit", params={"limit": 1000}).json()["items"]
    jl = client.get("/v1/audit/export", params={"format": "jsonl"})
    assert jl.headers["content-type"].startswith("application/x-ndjson")
    exported = [json.loads(line) for line in jl.text.splitlines()]
    assert [e["id"] for e in exported] == [e["id"] for e in events]
    assert all(e["hash"] and e["seq"] for e in exported)  # export seals pending events first
    rows = list(
        csv.DictReader(io.StringIO(client.get("/v1/audit/export", params={"format": "csv", "node": "gpu-18"}).text))
    )
    assert rows and all(r["node"] == "gpu-18" for r in rows)


def test_signed_checkpoint_checks_a_fresh_copy(client, settings, monkeypatch, tmp_path):
    fleet(client)
    cp = client.post("/v1/audit/checkpoints")
    assert cp.status_code == 201
    claims = cp.json()["claims"]
    f = tmp_path / "checkpoint.jws"
    f.write_text(cp.json()["checkpoint"])
    for k, v in {
        "PREFLIGHT_DATABASE_URL": settings.resolved_database_url,
        "PREFLIGHT_DATA_DIR": str(settings.data_dir),
    }.items():
        monkeypatch.setenv(k, v)
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps(client.get("/.well-known/jwks.json").json()))
    ok = runner.invoke(cli, ["audit", "check-checkpoint", str(f), "--jwks", str(jwks)])
    assert ok.exit_code == 0, ok.stdout
    assert json.loads(ok.stdout)["head"] == claims["head"]
    plan(client, "llama-8b", ["gpu-18"])  # appending after the checkpoint is fine
    assert runner.invoke(cli, ["audit", "check-checkpoint", str(f), "--jwks", str(jwks)]).exit_code == 0
    from sqlalchemy import create_engine, text

    engine = create_engine(settings.resolved_database_url)
    with engine.begin() as conn:  # rewrite history before the checkpoint, then re-chain it so verify alone passes
        conn.execute(text("DELETE FROM audit_events WHERE id = 1"))
    engine.dispose()
    bad = runner.invoke(cli, ["audit", "check-checkpoint", str(f), "--jwks", str(jwks)])
    assert bad.exit_code == 1 and json.loads(bad.stdout)["ok"] is False
    forged = tmp_path / "forged.jws"
    h, p, s = cp.json()["checkpoint"].split(".")
    forged.write_text(f"{h}.{p}.{s[:-4]}AAAA")
    assert runner.invoke(cli, ["audit", "check-checkpoint", str(forged), "--jwks", str(jwks)]).exit_code == 1


def test_audit_verify_cli_exit_codes(client, settings, monkeypatch):
    fleet(client)
    monkeypatch.setenv("PREFLIGHT_DATABASE_URL", settings.resolved_database_url)
    monkeypatch.setenv("PREFLIGHT_DATA_DIR", str(settings.data_dir))
    assert client.get("/v1/audit/verify").json()["ok"] is True  # (waits for the sealer)
    assert runner.invoke(cli, ["audit", "verify"]).exit_code == 0
    from sqlalchemy import create_engine, text

    engine = create_engine(settings.resolved_database_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE audit_events SET kind = 'node.deleted' WHERE id = 2"))
    engine.dispose()
    out = runner.invoke(cli, ["audit", "verify"])
    assert out.exit_code == 1 and json.loads(out.stdout)["first_broken"]["id"] == 2


def test_idempotency_key_replays_and_refuses_a_different_body(client):
    fleet(client)
    body = {"manifest": "llama-8b", "nodes": ["gpu-18"], "engine_args": {"max_model_len": 8192}}
    a = client.post("/v1/plans", json=body, headers={"Idempotency-Key": "k1"})
    b = client.post("/v1/plans", json=body, headers={"Idempotency-Key": "k1"})
    assert a.status_code == b.status_code == 201 and a.json()["id"] == b.json()["id"]
    assert b.headers.get("Idempotent-Replayed") == "true"
    c = client.post(
        "/v1/plans", json={**body, "engine_args": {"max_model_len": 4096}}, headers={"Idempotency-Key": "k1"}
    )
    assert c.status_code == 422
    m = {"name": "x", "version": "1", "uri": "s3://x", "config": model_config("meta-llama__Meta-Llama-3.1-8B")}
    assert client.post("/v1/manifests", json=m, headers={"Idempotency-Key": "m1"}).status_code == 201
    again = client.post("/v1/manifests", json=m, headers={"Idempotency-Key": "m1"})
    assert again.status_code == 201 and again.headers.get("Idempotent-Replayed") == "true"
    assert client.post("/v1/manifests", json=m).status_code == 409  # without a key, a duplicate is a conflict


def test_rejected_plan_with_a_key_stores_nothing_and_stays_rejected(client):
    fleet(client)
    body = {"manifest": "llama-70b", "nodes": ["gpu-17"], "engine_args": {"tensor_parallel_size": 3}}
    for _ in range(2):
        r = client.post("/v1/plans", json=body, headers={"Idempotency-Key": "bad"})
        assert r.status_code == 422 and r.json()["findings"]


def test_if_match_on_node_update(client):
    fleet(client)
    r = client.get("/v1/nodes/gpu-17")
    etag = r.headers["ETag"]
    ok = client.patch("/v1/nodes/gpu-17", json={"labels": {"rack": "r1"}}, headers={"If-Match": etag})
    assert ok.status_code == 200 and ok.json()["labels"] == {"rack": "r1"} and ok.headers["ETag"] != etag
    stale = client.patch("/v1/nodes/gpu-17", json={"gpu_count": 4}, headers={"If-Match": etag})
    assert stale.status_code == 412 and stale.headers["content-type"] == "application/problem+json"
    assert client.get("/v1/nodes/gpu-17").json()["gpu_count"] == 8
    assert client.get("/v1/nodes/gpu-17").headers["ETag"] == ok.headers["ETag"]  # the PATCH's ETag is current
    again = client.patch("/v1/nodes/gpu-17", json={"gpu_count": 4}, headers={"If-Match": ok.headers["ETag"]})
    assert again.status_code == 200 and again.json()["gpu_count"] == 4
    kinds = [e["kind"] for e in client.get("/v1/audit", params={"node": "gpu-17"}).json()["items"]]
    assert kinds.count("node.updated") == 2


def test_manifest_new_version_supersedes(client):
    fleet(client)
    client.post(
        "/v1/manifests",
        json={
            "name": "llama-8b",
            "version": "2",
            "uri": "s3://llama-8b-v2",
            "config": model_config("meta-llama__Meta-Llama-3.1-8B"),
        },
    )
    kinds = [e["kind"] for e in client.get("/v1/audit", params={"model": "llama-8b"}).json()["items"]]
    assert kinds == ["manifest.registered", "manifest.registered", "manifest.superseded"]
