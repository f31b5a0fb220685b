"""Upgrade impact: a store holding plans that break across version lines names each of them, with the rule and
the remedy; plans that survive the upgrade are listed as such. The CLI prints the same and exits 1."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.support import model_config
from tests.support.api import register_node


def manifest(client, name, fixture="meta-llama__Meta-Llama-3.1-8B", **extra):
    r = client.post(
        "/v1/manifests",
        json={"name": name, "version": "1", "uri": f"s3://weights/{name}", "config": model_config(fixture), **extra},
    )
    assert r.status_code == 201, r.text


def plan(client, manifest_name, node, version, **engine_args):
    r = client.post(
        "/v1/plans",
        json={
            "manifest": manifest_name,
            "nodes": [node],
            "vllm_version": version,
            "environment": "benchmark",
            "engine_args": engine_args,
        },
    )
    assert r.status_code == 201, r.text
    return r.json()["id"]


def fleet(client):
    for n in ("n-swap", "n-bnb", "n-ok"):
        register_node(client, name=n, gpu="h100-sxm-80gb", count=1)
    manifest(client, "llama-8b")
    swap = plan(client, "llama-8b", "n-swap", "0.15.1", swap_space=4, max_model_len=8192)
    bnb = plan(client, "llama-8b", "n-bnb", "0.21.0", quantization="bitsandbytes", max_model_len=8192)
    ok = plan(client, "llama-8b", "n-ok", "0.28.0", max_model_len=8192)
    return swap, bnb, ok


def test_upgrade_impact_names_each_breaking_plan(client):
    swap, bnb, ok = fleet(client)
    r = client.get("/v1/upgrade-impact", params={"vllm_version": "0.33"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["vllm_version"] == "0.33.0" and out["checked"] == 3 and out["breaking"] == 2
    by_id = {p["plan"]: p for p in out["plans"]}
    assert by_id[swap]["breaks"] and by_id[swap]["nodes"] == ["n-swap"]
    f = by_id[swap]["findings"][0]
    assert (
        f["rule"] == "flag_unsupported" and "--swap-space" in f["message"] and f["remedy"] == {"drop": ["swap_space"]}
    )
    g = next(f for f in by_id[bnb]["findings"] if f["rule"] == "quant_unknown")
    assert "bitsandbytes" in g["message"] and "vllm-bnb-plugin" in g["message"]
    assert not by_id[ok]["breaks"] and by_id[ok]["verdict"] in ("accept", "warn")
    # the same store judged against the line the swap plan was made for: swap_space is fine there
    old = client.get("/v1/upgrade-impact", params={"vllm_version": "0.15.1"}).json()
    assert not {p["plan"]: p for p in old["plans"]}[swap]["breaks"]


def test_unsupported_target_version_is_a_422(client):
    r = client.get("/v1/upgrade-impact", params={"vllm_version": "9.1"})
    assert r.status_code == 422 and "vllm_version" in r.text


def test_cli_upgrade_check_prints_and_exits_1(client, monkeypatch):
    from service import cli

    swap, bnb, _ = fleet(client)
    monkeypatch.setattr(cli.common, "client", lambda server, token: client)
    res = CliRunner().invoke(cli.app, ["upgrade-check", "--to", "0.33", "--server", "http://x", "--token", "t"])
    assert res.exit_code == 1, res.output
    assert f"BREAKS plan {swap}" in res.output and f"BREAKS plan {bnb}" in res.output and "2 would break" in res.output
    res = CliRunner().invoke(
        cli.app, ["upgrade-check", "--to", "0.33", "--server", "http://x", "--token", "t", "--json"]
    )
    assert json.loads(res.output)["breaking"] == 2
