"""A rollout as the API and the pages show it (service/services/rollouts/views.py): the listing, env values
hidden from auditors, the fleet page and a rollout's page."""

from __future__ import annotations


def test_listing_and_auditor_sees_no_env_values(fleet):
    r = fleet.rollout(env={"VLLM_LOGGING_LEVEL": "DEBUG"})
    items = fleet.api.get("/v1/rollouts").json()["items"]
    assert [i["id"] for i in items] == [r["id"]] and items[0]["state"] == "pending"
    assert items[0]["nodes_total"] == 4 and items[0]["failures"] == 0 and "nodes" not in items[0]
    assert fleet.api.get("/v1/rollouts", params={"state": "completed"}).json()["items"] == []
    tok = fleet.api.post("/v1/tokens", json={"role": "auditor"}).json()["token"]
    seen = fleet.api.get(f"/v1/rollouts/{r['id']}", headers={"Authorization": f"Bearer {tok}"}).json()
    assert seen["target"]["env"] == {"VLLM_LOGGING_LEVEL": "<redacted>"}
    assert (
        fleet.api.post(f"/v1/rollouts/{r['id']}/pause", headers={"Authorization": f"Bearer {tok}"}).status_code == 403
    )
    assert fleet.api.get("/v1/rollouts/nope").status_code == 404


def test_the_fleet_page_lists_rollouts(fleet):
    r = fleet.rollout()
    fleet.tick()
    fleet.report("gpu-01", fleet.status(r["id"])["nodes"][0]["new_plan_id"], "failed")
    fleet.tick()
    page = fleet.api.get("/ui/")
    assert page.status_code == 200
    row = page.text[page.text.index(f'data-rollout="{r["id"]}"') :]
    row = row[: row.index("</tr>")]
    assert "rolled_back" in row and "0 of 0–1" in row and "25 %, 100 %" in row and "1 / 0" in row
    assert "failure_limit 0" in row


def test_a_rollouts_page_shows_its_waves_nodes_evidence_and_steps(fleet):
    r = fleet.rollout()
    fleet.tick()
    new_id = fleet.status(r["id"])["nodes"][0]["new_plan_id"]
    fleet.report("gpu-01", new_id, "failed", tail="torch.OutOfMemoryError: <b>CUDA</b> \u202eevil\u3164")
    fleet.tick()
    fleet_page = fleet.api.get("/ui/").text
    assert f'<a href="/ui/rollouts/{r["id"]}">' in fleet_page and "meta-llama/Llama-3.1-70B@1" in fleet_page
    page = fleet.api.get(f"/ui/rollouts/{r['id']}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    html = page.text
    row = html[html.index('data-node="gpu-01"') :]
    row = row[: row.index("</tr>")]
    assert "restored" in row and f"/ui/plans/{new_id}" in row and "report_failed" in row
    assert "&lt;b&gt;CUDA&lt;/b&gt;" in row and "<b>CUDA</b>" not in html  # what an agent sent is escaped
    assert "\\u202eevil\\u3164" in row and "\u202e" not in html and "\u3164" not in html  # and shown as it is
    waves = html[html.index('id="waves"') : html.index('id="rollout-nodes"')]
    assert waves.count("status-halted") == 1 and waves.count("status-cancelled") == 1
    assert 'data-kind="rollout.halted"' in html and 'data-kind="rollout.node_restored"' in html
    assert fleet.api.get("/ui/rollouts/no-such-rollout").status_code == 404
    assert fleet.api.get("/ui/rollouts/" + "x" * 300).status_code == 404
