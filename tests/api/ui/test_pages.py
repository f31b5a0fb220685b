"""The operators' pages over HTTP (both databases): sign-in and the session cookie, CSRF, roles, hostile input
(4xx naming the field, escaped), and pages that load nothing from another host. The browser tests
(tests/api/ui/test_browser.py) drive the same pages in Chromium."""

from __future__ import annotations

import base64
import json
import re
import time

from service.api.ui import SESSION_COOKIE, safe_next
from tests.support import ADMIN
from tests.support.api import fleet_of_two, register_manifest, register_node
from tests.support.pages import assert_page_is_local, csrf_of, login

XSS = "<script>alert('x')</script>"


def cookie_payload(value: str) -> dict:
    body = value.split(".")[0]
    return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))


def test_root_redirects_and_pages_need_sign_in(client):
    r = client.get("/", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/ui/"
    client.headers.pop("Authorization")
    r = client.get("/ui/audit?node=gpu-01", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login?next=%2Fui%2Faudit%3Fnode%3Dgpu-01"


def test_sign_in_sets_a_signed_httponly_strict_cookie_without_the_token(client):
    r = login(client, next_="/ui/audit")
    assert r.status_code == 303 and r.headers["location"] == "/ui/audit"
    set_cookie = [h for h in r.headers.get_list("set-cookie") if h.startswith(SESSION_COOKIE + "=")][0]
    assert "HttpOnly" in set_cookie and "SameSite=strict" in set_cookie and "Path=/ui" in set_cookie
    assert "Max-Age=28800" in set_cookie
    value = client.cookies[SESSION_COOKIE]
    assert ADMIN not in value and ADMIN not in base64.urlsafe_b64decode(value.split(".")[0] + "==").decode()
    assert set(cookie_payload(value)) == {"t", "h", "n"}
    page = client.get("/ui/audit")
    assert page.status_code == 200 and "Signed in as" in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    assert page.headers["cache-control"] == "no-store"


def test_sign_in_refusals(client):
    agent = register_node(client)["agent_token"]
    assert login(client, "not-a-token").status_code == 401
    r = login(client, agent)
    assert r.status_code == 403 and "agent tokens cannot sign in" in r.text
    assert login(client, "x" * 600).status_code == 422
    client.get("/ui/login")
    r = client.post("/ui/login", data={"token": ADMIN, "csrf": "0" * 64}, follow_redirects=False)
    assert r.status_code == 403 and SESSION_COOKIE not in r.cookies
    assert login(client, next_="//evil.example/x").headers["location"] == "/ui/"
    assert [safe_next(v) for v in ("/ui/plans/x", "https://evil.example/", "/ui/\\evil", "/docs")] == [
        "/ui/plans/x",
        "/ui/",
        "/ui/",
        "/ui/",
    ]


def test_revoked_token_ends_its_session_and_a_tampered_cookie_is_refused(client):
    made = client.post("/v1/tokens", json={"role": "auditor"}).json()
    admin = client.headers["Authorization"]
    assert login(client, made["token"]).status_code == 303
    assert client.get("/ui/audit").status_code == 200
    value = client.cookies[SESSION_COOKIE]
    assert cookie_payload(value)["t"] == made["id"]
    r = client.post(f"/v1/tokens/{made['id']}/revoke", headers={"Authorization": admin})
    assert r.status_code == 200
    assert client.get("/ui/audit", follow_redirects=False).status_code == 303  # looked up on every request
    client.cookies.set(SESSION_COOKIE, value[:-2] + ("AA" if not value.endswith("AA") else "BB"), path="/ui")
    assert client.get("/ui/", follow_redirects=False).status_code == 303


def test_expired_session_is_refused(client, monkeypatch):
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 9 * 3600)  # signed nine hours ago
    assert login(client).status_code == 303
    monkeypatch.setattr(time, "time", real)
    assert client.get("/ui/", follow_redirects=False).status_code == 303


def test_posts_with_the_cookie_need_the_csrf_token(client):
    fleet_of_two(client)
    bearer = client.headers["Authorization"]
    login(client)
    form = {
        "manifest": "meta-llama/Llama-3.1-70B@1",
        "nodes": ["gpu-01"],
        "engine_args": '{"tensor_parallel_size": 8, "max_model_len": 8192}',
    }
    r = client.post("/ui/try", data=form)
    assert r.status_code == 403 and "csrf" in r.text
    token = csrf_of(client.get("/ui/try").text)
    r = client.post("/ui/try", data={**form, "csrf": token})
    assert r.status_code == 200 and re.search(r'id="verdict">(accept|warn)<', r.text)
    assert client.post("/ui/logout", data={}, follow_redirects=False).status_code == 403
    # the bearer header is not sent by a browser on its own: no CSRF token needed
    client.cookies.clear()
    r = client.post("/ui/try", data=form, headers={"Authorization": bearer})
    assert r.status_code == 200 and "--tensor-parallel-size 8" in r.text
    r = client.post("/ui/logout", data={"csrf": token}, follow_redirects=False)
    assert r.status_code == 303


def test_dry_run_page_stores_nothing_and_names_bad_fields(client):
    fleet_of_two(client)
    before = client.get("/v1/plans").json()["items"]
    ok = {"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": ["gpu-01"], "engine_args": "{}"}
    for patch, field in (
        ({"engine_args": "{not json"}, "engine_args"),
        ({"engine_args": "[1]"}, "engine_args"),
        ({"avg_seq_len": "many"}, "workload.avg_seq_len"),
        ({"nodes": []}, "nodes"),
        ({"manifest": "nope@1"}, "manifest"),
        ({"nodes": ["gpu-01", "gpu-02", "gpu-99"]}, "name"),
        ({"environment": "lab"}, "environment"),
        ({"shape": XSS}, "workload.shape"),
    ):
        r = client.post("/ui/try", data={**ok, **patch})
        assert r.status_code == 422, (patch, r.status_code)
        assert f"<code>{field}</code>" in r.text, (patch, r.text[-1500:])
        assert XSS not in r.text
    r = client.post("/ui/try", data={**ok, "engine_args": '{"tensor_parallel_size": 3}'})
    assert r.status_code == 200 and 'id="verdict">reject<' in r.text and "tp_heads_divisible" in r.text
    assert client.get("/v1/plans").json()["items"] == before


def test_dry_run_engine_args_nested_past_the_parser_is_a_422_naming_the_field(client):
    # json.loads raises RecursionError (not a ValueError) on text nested deeper than the interpreter's stack
    fleet_of_two(client)
    form = {"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": ["gpu-01"], "engine_args": "[" * 30000}
    r = client.post("/ui/try", data=form)
    assert r.status_code == 422 and "<code>engine_args</code>" in r.text and "nested too deeply" in r.text


def test_roles_see_what_the_api_shows_them(client):
    register_node(client)
    register_manifest(client)
    plan = client.post(
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-70B@1",
            "nodes": ["gpu-01"],
            "env": {"VLLM_API_KEY": "s3cret-value"},
            "engine_args": {"tensor_parallel_size": 8, "max_model_len": 8192},
        },
    ).json()
    auditor = client.post("/v1/tokens", json={"role": "auditor"}).json()["token"]
    deployer = client.post("/v1/tokens", json={"role": "deployer"}).json()["token"]
    as_auditor = {"Authorization": f"Bearer {auditor}"}
    as_deployer = {"Authorization": f"Bearer {deployer}"}
    page = client.get(f"/ui/plans/{plan['id']}", headers=as_auditor)
    assert page.status_code == 200 and "s3cret-value" not in page.text and "VLLM_API_KEY=&lt;redacted&gt;" in page.text
    assert "s3cret-value" in client.get(f"/ui/plans/{plan['id']}", headers=as_deployer).text
    assert client.get("/ui/try", headers=as_auditor).status_code == 403
    assert client.get("/ui/audit", headers=as_auditor).status_code == 200
    assert client.get("/ui/audit", headers=as_deployer).status_code == 403
    assert client.get("/ui/", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_hostile_names_and_filters_are_escaped_and_named(client):
    register_node(client)
    register_manifest(client, name=XSS)
    plan = client.post(
        "/v1/plans",
        json={
            "manifest": f"{XSS}@1",
            "nodes": ["gpu-01"],
            "engine_args": {"tensor_parallel_size": 8, "max_model_len": 8192},
        },
    ).json()
    escaped = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"
    for path in ("/ui/", f"/ui/plans/{plan['id']}", "/ui/audit", "/ui/try"):
        r = client.get(path)
        assert r.status_code == 200 and XSS not in r.text and escaped in r.text, path
    for path, status, field in (
        ("/ui/?status=" + XSS, 422, "status"),
        ("/ui/audit?since=yesterday", 422, "since"),
        ("/ui/audit?since=2026-12-02&until=2026-12-01", 422, "until"),
        ("/ui/audit?before=abc", 422, "before"),
        ("/ui/audit?node=" + "n" * 200, 422, "node"),
        ("/ui/audit?model=%00", 422, "model"),
        ("/ui/plans/" + "x" * 40, 404, "plan_id"),
        ("/ui/plans/no-such-plan", 404, "plan_id"),
    ):
        r = client.get(path)
        assert r.status_code == status and f"<code>{field}</code>" in r.text, (path, r.status_code, r.text[-800:])
        assert XSS not in r.text
    r = client.get("/ui/audit", params={"model": XSS})
    assert r.status_code == 200 and f'value="{escaped}"' in r.text


def test_filters_pick_rows(client):
    fleet_of_two(client)
    r = client.post(
        "/v1/nodes", json={"name": "gpu-05", "gpu": "h100-sxm-80gb", "gpu_count": 8, "address": "10.0.0.15"}
    )
    assert r.status_code == 201, r.text
    row = client.get("/ui/").text.split('data-node="gpu-05"')[1].split("</tr>")[0]
    assert '<td data-label="Address">10.0.0.15</td>' in row and "unplanned" in row
    page = client.get("/ui/", params={"status": "refused"}).text
    assert 'data-node="gpu-02"' in page and 'data-node="gpu-01"' not in page
    page = client.get("/ui/", params={"model": "meta-llama/Llama-3.1-70B"}).text
    assert 'data-node="gpu-01"' in page and 'data-node="gpu-02"' not in page
    page = client.get("/ui/audit", params={"node": "gpu-02", "kind": "agent.refused"}).text
    assert page.count('<li data-kind="agent.refused">') == 1 and 'data-kind="plan.created"' not in page
    verified = client.get("/ui/audit", params={"verify": "1"}).text
    assert 'id="verify-status"' in verified and "intact" in verified


def test_pages_load_nothing_from_another_host(client):
    p1, _ = fleet_of_two(client)
    seen: set[str] = set()
    for path in ("/ui/", f"/ui/plans/{p1['id']}", "/ui/audit", "/ui/try", "/docs"):
        assert_page_is_local(client, path, seen)
    assert {"/ui/static/app.css", "/ui/static/app.js", "/ui/static/favicon.svg"} <= seen
    client.headers.pop("Authorization")
    assert_page_is_local(client, "/ui/login", seen)


def test_a_multi_node_group_is_one_fleet_row_as_healthy_as_its_least_healthy_member(client):
    from tests.support.multi_node import TP16, agent_headers, deepseek, node, plan

    ta = node(client, "grp-a", "10.0.9.1")["agent_token"]
    tb = node(client, "grp-b", "10.0.9.2")["agent_token"]
    node(client, "solo", "10.0.9.3")
    deepseek(client)
    p = plan(client, ["grp-a", "grp-b"], TP16)
    listed = {n["name"]: n for n in client.get("/v1/nodes").json()["items"]}
    assert (listed["grp-b"]["plan"]["role"], listed["grp-b"]["plan"]["rank"], listed["grp-b"]["plan"]["group"]) == (
        "worker",
        1,
        0,
    )
    for name, token in (("grp-a", ta), ("grp-b", tb)):
        r = client.post(
            f"/v1/nodes/{name}/reports", headers=agent_headers(token), json={"plan_id": p["id"], "status": "running"}
        )
        assert r.status_code == 201, r.text
    page = client.get("/ui/").text
    assert 'data-node="grp-b"' not in page and page.count('data-group="grp-a grp-b"') == 1
    row = page.split('data-group="grp-a grp-b"')[1].split("</tr>")[0]
    assert "group of 2" in row and "× 16 (2 nodes)" in row and 'status status-running">running</span>\n' in row
    assert re.search(r"3 nodes:", page)  # the summary counts nodes, not rows
    r = client.post(
        "/v1/nodes/grp-b/reports",
        headers=agent_headers(tb),
        json={"plan_id": p["id"], "status": "exited", "details": {"status": 1}},
    )
    assert r.status_code == 201, r.text
    row = client.get("/ui/").text.split('data-group="grp-a grp-b"')[1].split("</tr>")[0]
    assert 'data-label="Status"><span class="status status-failed">failed</span>' in row
    failed = client.get("/ui/", params={"status": "failed"}).text
    assert 'data-group="grp-a grp-b"' in failed and 'data-node="solo"' not in failed


def test_the_bearer_header_comes_before_the_cookie_and_needs_no_csrf(client):
    fleet_of_two(client)
    admin = {"Authorization": client.headers["Authorization"]}
    deployer = client.post("/v1/tokens", json={"role": "deployer"}).json()["token"]
    auditor = client.post("/v1/tokens", json={"role": "auditor"}).json()["token"]
    assert login(client, auditor).status_code == 303  # the cookie speaks for an auditor
    as_deployer = {"Authorization": f"Bearer {deployer}"}
    r = client.get("/ui/try", headers=as_deployer)
    assert r.status_code == 200 and "(deployer)" in r.text and 'action="/ui/logout"' not in r.text
    form = {"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": ["gpu-01"], "engine_args": "{}"}
    r = client.post("/ui/try", data=form, headers=as_deployer)  # the cookie is there too: still no CSRF needed
    assert r.status_code == 200 and 'id="verdict">' in r.text
    r = client.get("/ui/", headers={"Authorization": "Bearer nope"})  # a bad header: no falling back on the cookie
    assert r.status_code == 401 and "Signed in as" not in r.text
    assert client.get("/ui/audit").status_code == 200  # the cookie alone
    assert client.get("/ui/audit", headers=admin).status_code == 200


def test_authorization_header_refusals_are_html_pages(client):
    agent = register_node(client)["agent_token"]
    made = client.post("/v1/tokens", json={"role": "deployer"}).json()
    assert client.post(f"/v1/tokens/{made['id']}/revoke").status_code == 200
    client.headers.pop("Authorization")
    for headers, status, text in (
        ([("Authorization", f"Bearer {ADMIN}")] * 2, 401, "exactly one"),
        ([("Authorization", f"Basic {ADMIN}")], 401, "exactly one"),
        ([("Authorization", f"Bearer {made['token']}")], 401, "revoked"),
        ([("Authorization", f"Bearer {agent}")], 403, "agent tokens cannot use"),
    ):
        r = client.get("/ui/", headers=headers, follow_redirects=False)
        assert r.status_code == status and text in r.text, (headers, r.status_code, r.text[-500:])
        assert r.headers["content-type"].startswith("text/html") and "Signed in as" not in r.text
        assert r.headers["content-security-policy"].startswith("default-src 'self'")


def test_a_role_the_page_does_not_admit_is_403_with_the_viewers_navigation(client):
    deployer = client.post("/v1/tokens", json={"role": "deployer"}).json()["token"]
    auditor = client.post("/v1/tokens", json={"role": "auditor"}).json()["token"]
    for token, path, needs in ((auditor, "/ui/try", "admin or deployer"), (deployer, "/ui/audit", "admin or auditor")):
        client.cookies.clear()
        assert login(client, token).status_code == 303
        r = client.get(path)
        assert r.status_code == 403 and f"needs {needs}" in r.text and "Signed in as" in r.text, r.text[-500:]
        assert 'action="/ui/logout"' in r.text  # signed in by cookie: the sign-out form is there
    r = client.get("/ui/plans/no-such-plan")  # an API error on a page is the HTML error page, never problem+json
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html") and "Signed in as" in r.text


def test_a_csrf_token_is_bound_to_its_session(client):
    fleet_of_two(client)
    form = {"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": ["gpu-01"], "engine_args": "{}"}
    login(client)
    first = csrf_of(client.get("/ui/try").text)
    login_form_token = csrf_of(client.get("/ui/login").text)
    login(client)  # a second session: a new cookie
    second = csrf_of(client.get("/ui/try").text)
    assert first != second
    for token in (first, login_form_token, "", "0" * 64, second[:-1]):
        r = client.post("/ui/try", data={**form, "csrf": token})
        assert r.status_code == 403 and "<code>csrf</code>" in r.text, token
    assert client.post("/ui/try", data={**form, "csrf": second}).status_code == 200
    assert client.post("/ui/logout", data={"csrf": first}, follow_redirects=False).status_code == 403
    r = client.post("/ui/logout", data={"csrf": second}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"
    assert client.get("/ui/try", follow_redirects=False).status_code == 303  # signed out
