"""The operators' pages in a real headless Chromium (Debian's /usr/bin/chromium driven by Playwright for Python;
Playwright's own browser download is never used): sign in, the fleet with two nodes and their plans, a plan's
command and memory bar, the audit filtered and verified, a dry run's verdict, a phone-sized screen, keyboard
focus, a hostile model name, and no request to another host. Screenshots go to var/ui-screenshots/ for a person
to look at. Every wait is on an element or a URL, never a sleep.

Without Chromium (or Playwright) the tests are skipped, unless PREFLIGHT_BROWSER_TESTS=required (CI: .ci/run
installs Debian's chromium and sets it), where a missing browser fails."""

from __future__ import annotations

import os
import pathlib
import re
import shutil

import httpx
import pytest

from service.db.migrate import upgrade
from tests.support import ADMIN, model_config
from tests.support.live import free_port, start_server

CHROMIUM = os.environ.get("PREFLIGHT_CHROMIUM", "/usr/bin/chromium")
REQUIRED = os.environ.get("PREFLIGHT_BROWSER_TESTS") == "required"
SHOTS = pathlib.Path(__file__).resolve().parents[3] / "var" / "ui-screenshots"
XSS_MODEL = "<script>window.__pwned=1</script>"
TIMEOUT_MS = 30_000  # generous: a loaded 2-core machine; waits end as soon as the element is there

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - the dev extras install it
    sync_playwright = None

if sync_playwright is None or not shutil.which(CHROMIUM):
    if REQUIRED:
        raise RuntimeError(
            f"browser tests are required (PREFLIGHT_BROWSER_TESTS=required) but "
            f"{'playwright is not installed' if sync_playwright is None else CHROMIUM + ' is missing'}"
        )
    pytestmark = pytest.mark.skip(reason=f"no Chromium at {CHROMIUM} or no Playwright (apt-get install chromium)")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """The service under uvicorn on SQLite with a fleet: gpu-01 runs Llama-3.1-70B (reported running with vLLM's
    figures), gpu-02 has a Llama-3.1-8B plan its agent refused, gpu-03 a plan for a model with a hostile name."""
    tmp = tmp_path_factory.mktemp("ui")
    url = f"sqlite:///{tmp / 'preflight.db'}"
    upgrade(url)
    port = free_port()
    proc = start_server(url, tmp / "var", port)
    base = f"http://127.0.0.1:{port}"
    c = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)
    agents = {}
    for name in ("gpu-01", "gpu-02", "gpu-03"):
        r = c.post("/v1/nodes", json={"name": name, "gpu": "h100-sxm-80gb", "gpu_count": 8, "interconnect": "nvlink"})
        assert r.status_code == 201, r.text
        agents[name] = {"Authorization": f"Bearer {r.json()['agent_token']}"}
    for fixture, model in (
        ("meta-llama__Meta-Llama-3.1-70B", "meta-llama/Llama-3.1-70B"),
        ("meta-llama__Meta-Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
        ("meta-llama__Meta-Llama-3.1-8B", XSS_MODEL),
    ):
        r = c.post(
            "/v1/manifests",
            json={"name": model, "version": "1", "uri": "s3://weights/m", "config": model_config(fixture)},
        )
        assert r.status_code == 201, r.text
    plans = {}
    for node, model, args in (
        ("gpu-01", "meta-llama/Llama-3.1-70B", {"tensor_parallel_size": 8, "max_model_len": 8192}),
        ("gpu-02", "meta-llama/Llama-3.1-8B", {"max_model_len": 4096}),
        ("gpu-03", XSS_MODEL, {"max_model_len": 4096}),
    ):
        r = c.post(
            "/v1/plans",
            json={"manifest": f"{model}@1", "nodes": [node], "engine_args": {**args, "gpu_memory_utilization": 0.9}},
        )
        assert r.status_code == 201, r.text
        plans[node] = r.json()
    r = c.post(
        "/v1/nodes/gpu-01/reports",
        headers=agents["gpu-01"],
        json={
            "plan_id": plans["gpu-01"]["id"],
            "status": "running",
            "message": "vLLM serving",
            "details": {"vllm": {"kv_cache_tokens": 1_000_000}},
        },
    )
    assert r.status_code == 201, r.text
    r = c.post(
        "/v1/nodes/gpu-02/reports",
        headers=agents["gpu-02"],
        json={"plan_id": plans["gpu-02"]["id"], "status": "refused", "message": "signature did not verify"},
    )
    assert r.status_code == 201, r.text
    yield {"base": base, "client": c, "plans": plans}
    c.close()
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def browser():
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
            ],
        )
        expect.set_options(timeout=TIMEOUT_MS)
        yield b
        b.close()


def new_page(browser, live, *, width=1280, height=900, storage=None):
    """A page that records every URL the browser asks for (checked against the service's own origin)."""
    ctx = browser.new_context(viewport={"width": width, "height": height}, storage_state=storage, base_url=live["base"])
    ctx.set_default_timeout(TIMEOUT_MS)
    page = ctx.new_page()
    page.requested = []
    page.on("request", lambda req: page.requested.append(req.url))
    page.errors = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    return ctx, page


def assert_only_own_host(page, base):
    foreign = [u for u in page.requested if not (u.startswith(base + "/") or u.startswith("data:"))]
    assert not foreign, f"requests to another host: {foreign}"
    assert page.requested, "nothing was requested"


def sign_in(page, live):
    page.goto("/")
    page.wait_for_url(re.compile(r"/ui/login\?next="))
    page.get_by_label("Token").fill(ADMIN)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(live["base"] + "/ui/")


def test_operator_journey(browser, live):
    ctx, page = new_page(browser, live)
    sign_in(page, live)
    cookie = next(c for c in ctx.cookies() if c["name"] == "pf_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert ADMIN not in cookie["value"]

    # fleet: the nodes and their plans
    g1, g2 = page.locator('tr[data-node="gpu-01"]'), page.locator('tr[data-node="gpu-02"]')
    expect(g1).to_contain_text("meta-llama/Llama-3.1-70B")
    expect(g1.locator(".status").first).to_have_text("running")
    expect(g1).to_contain_text("NVIDIA H100")
    expect(g1).to_contain_text("1,000,000")  # measured KV tokens from the agent's report
    predicted = live["plans"]["gpu-01"]["budget"]["kv_cache_tokens"]
    expect(g1).to_contain_text(f"{predicted:,}")
    expect(g2).to_contain_text("meta-llama/Llama-3.1-8B")
    expect(g2.locator(".status").first).to_have_text("refused")
    expect(page.locator("#fleet tbody tr")).to_have_count(3)
    page.screenshot(path=str(SHOTS / "fleet-1280.png"), full_page=True)

    page.get_by_label("Status").select_option("refused")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"status=refused"))
    expect(page.locator("#fleet tbody tr")).to_have_count(1)
    expect(page.locator('tr[data-node="gpu-02"]')).to_be_visible()
    page.goto("/ui/")

    # plan: its command and memory bar
    plan = live["plans"]["gpu-01"]
    page.locator('tr[data-node="gpu-01"]').get_by_role("link", name=plan["id"][:8]).first.click()
    page.wait_for_url(live["base"] + f"/ui/plans/{plan['id']}")
    expect(page.locator("#command")).to_have_text(plan["command"])
    expect(page.locator("#memory-bar")).to_be_visible()
    expect(page.locator("#memory-bar rect.seg-weights")).to_have_count(1)
    expect(page.locator("#memory-bar rect.seg-kv")).to_have_count(1)
    expect(page.locator('#memory-bar tr[data-segment="headroom"]')).to_be_visible()
    expect(page.locator("#concurrency")).to_contain_text("8,192")
    expect(page.locator("#placements")).to_contain_text("gpu-01")
    page.get_by_role("button", name="Copy command").click()
    expect(page.locator("#copy-status")).to_have_text(re.compile(r"Copied|Selected"))
    page.screenshot(path=str(SHOTS / "plan-1280.png"), full_page=True)

    # audit: filter by node and kind, verify the chain
    page.get_by_role("link", name="Audit").click()
    page.wait_for_url(live["base"] + "/ui/audit")
    page.get_by_label("Node").fill("gpu-02")
    page.get_by_label("Kind").fill("agent.refused")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"kind=agent.refused"))
    expect(page.locator("#timeline > li")).to_have_count(1)
    expect(page.locator("#timeline > li")).to_contain_text("gpu-02")
    page.get_by_label("Kind").fill("")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"node=gpu-02(&|$)(?!.*kind=agent)"))
    expect(page.locator('#timeline > li[data-kind="plan.created"]')).to_have_count(1)
    page.get_by_role("button", name="Verify the whole chain now").click()
    expect(page.locator("#verify-status")).to_contain_text("intact")
    page.screenshot(path=str(SHOTS / "audit-1280.png"), full_page=True)

    # try a launch: a rejected one, then one that passes; nothing stored
    before = live["client"].get("/v1/plans").json()["items"]
    page.get_by_role("link", name="Try a launch").click()
    page.wait_for_url(live["base"] + "/ui/try")
    page.get_by_label("Manifest").select_option("meta-llama/Llama-3.1-70B@1")
    page.get_by_label(re.compile(r"^gpu-01")).check()
    page.get_by_label("Engine arguments (JSON object)").fill('{"tensor_parallel_size": 3}')
    page.get_by_role("button", name="Judge this launch").click()
    expect(page.locator("#verdict")).to_have_text("reject")
    expect(page.locator("#result")).to_contain_text("tp_heads_divisible")
    page.get_by_label("Engine arguments (JSON object)").fill(
        '{"tensor_parallel_size": 8, "max_model_len": 8192, "gpu_memory_utilization": 0.9}'
    )
    page.get_by_label("Average").fill("2000")
    page.get_by_role("button", name="Judge this launch").click()
    expect(page.locator("#verdict")).to_have_text(re.compile(r"^(accept|warn)$"))
    expect(page.locator("#command")).to_contain_text("--tensor-parallel-size 8")
    expect(page.locator("#memory-bar")).to_be_visible()
    page.screenshot(path=str(SHOTS / "try-1280.png"), full_page=True)
    assert live["client"].get("/v1/plans").json()["items"] == before

    assert not page.errors, page.errors
    assert_only_own_host(page, live["base"])
    state = ctx.storage_state()
    ctx.close()

    # the same pages on a 390 px phone: no sideways scrolling
    ctx, phone = new_page(browser, live, width=390, height=844, storage=state)
    for path, name in (
        ("/ui/", "fleet"),
        (f"/ui/plans/{plan['id']}", "plan"),
        ("/ui/audit", "audit"),
        ("/ui/try", "try"),
    ):
        phone.goto(path)
        expect(phone.locator("main h1")).to_be_visible()
        assert phone.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), name
        phone.screenshot(path=str(SHOTS / f"{name}-390.png"), full_page=True)
    expect(phone.locator('tr[data-node="gpu-01"]')).to_have_count(0)  # (the try page has no fleet table)
    assert_only_own_host(phone, live["base"])
    ctx.close()


def test_hostile_model_name_is_text_not_script(browser, live):
    ctx, page = new_page(browser, live)
    sign_in(page, live)
    row = page.locator('tr[data-node="gpu-03"]')
    expect(row).to_contain_text(XSS_MODEL)  # shown literally
    assert page.evaluate("window.__pwned === undefined")
    page.goto(f"/ui/plans/{live['plans']['gpu-03']['id']}")
    expect(page.locator("main")).to_contain_text(XSS_MODEL)
    page.goto("/ui/audit?model=" + httpx.QueryParams({"m": XSS_MODEL})["m"])
    expect(page.locator("#a-model")).to_have_value(XSS_MODEL)
    assert page.evaluate("window.__pwned === undefined")
    ctx.close()


def test_keyboard_reaches_sign_in_and_skip_link(browser, live):
    ctx, page = new_page(browser, live)
    page.goto("/ui/login")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "skip"
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")  # the brand link, then the token field
    assert page.evaluate("document.activeElement.id") == "token"
    page.keyboard.type(ADMIN)
    page.keyboard.press("Enter")
    page.wait_for_url(live["base"] + "/ui/")
    expect(page.locator("#fleet")).to_be_visible()
    ctx.close()


def test_docs_load_offline_with_authorize(browser, live):
    ctx, page = new_page(browser, live)
    page.goto("/docs")
    expect(page.get_by_role("button", name=re.compile("Authorize"))).to_be_visible()
    expect(page.locator("#operations-plans-listPlans")).to_be_visible()
    page.screenshot(path=str(SHOTS / "docs-1280.png"))
    assert_only_own_host(page, live["base"])
    ctx.close()


def test_a_rollout_from_the_fleet_page_to_its_own_page(browser, live):
    """Last in this module: the rollout changes gpu-03's plan. Its page shows the waves, the node's outcome with the
    agent's words as text (the failure message carries markup), the plans as links, and the steps from the audit."""
    import time

    c = live["client"]
    r = c.post(
        "/v1/rollouts",
        json={
            "manifest": f"{XSS_MODEL}@1",
            "nodes": ["gpu-03"],
            "engine_args": {"max_model_len": 2048, "gpu_memory_utilization": 0.9},
            "waves": [{"percent": 100}],
        },
    )
    assert r.status_code == 201, r.text
    rid = r.json()["id"]
    deadline = time.time() + 60
    while (s := c.get(f"/v1/rollouts/{rid}").json())["nodes"][0]["new_plan_id"] is None:  # the scheduler signs it
        assert time.time() < deadline, s
        time.sleep(0.5)
    token = c.post("/v1/nodes/gpu-03/token").json()["agent_token"]
    rep = c.post(
        "/v1/nodes/gpu-03/reports",
        headers={"Authorization": f"Bearer {token}"},
        json={
            "plan_id": s["nodes"][0]["new_plan_id"],
            "status": "failed",
            "message": "<img src=x onerror=window.__pwned=2>",
        },
    )
    assert rep.status_code == 201, rep.text
    while c.get(f"/v1/rollouts/{rid}").json()["state"] != "rolled_back":
        assert time.time() < deadline
        time.sleep(0.5)

    ctx, page = new_page(browser, live)
    sign_in(page, live)
    row = page.locator(f'tr[data-rollout="{rid}"]')
    expect(row).to_contain_text("rolled_back")
    expect(row).to_contain_text(XSS_MODEL)
    row.get_by_role("link", name=rid[:8]).click()
    page.wait_for_url(live["base"] + f"/ui/rollouts/{rid}")
    expect(page.locator("main h1")).to_contain_text(rid)
    expect(page.locator("#rollout-facts")).to_contain_text(f"{XSS_MODEL}@1")
    expect(page.locator('#waves tr[data-wave="0"] .status')).to_have_text("halted")
    node = page.locator('#rollout-nodes tr[data-node="gpu-03"]')
    expect(node.locator(".status")).to_have_text("restored")
    expect(node).to_contain_text("<img src=x onerror=window.__pwned=2>")  # the agent's words, as text
    expect(page.locator('#rollout-events li[data-kind="rollout.node_restored"]')).to_have_count(1)
    assert page.evaluate("window.__pwned === undefined")
    node.get_by_role("link", name=s["nodes"][0]["new_plan_id"][:8]).click()
    page.wait_for_url(live["base"] + f"/ui/plans/{s['nodes'][0]['new_plan_id']}")
    page.go_back()
    page.screenshot(path=str(SHOTS / "rollout-1280.png"), full_page=True)
    assert not page.errors, page.errors
    assert_only_own_host(page, live["base"])
    state = ctx.storage_state()
    ctx.close()
    ctx, phone = new_page(browser, live, width=390, height=844, storage=state)
    phone.goto(f"/ui/rollouts/{rid}")
    expect(phone.locator("main h1")).to_be_visible()
    assert phone.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    phone.screenshot(path=str(SHOTS / "rollout-390.png"), full_page=True)
    ctx.close()
