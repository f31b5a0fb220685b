"""The node agent's boot (service/agent/boot.py) driven in process, with fakes for what a subprocess would add
nothing to: a scripted service (fetch, key sets, reports), a ManualClock (no test sleeps to age a plan or to wait
out a group hold), a fake node probe, a fake process runner and a fake re-exec. The real CLI against a live service
is tests/e2e/test_agent_boot.py."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from service.agent import runner
from service.agent.boot import CLOCK_SKEW_SECONDS, Boot, BootOptions
from service.agent.bootcheck import Refusal
from service.agent.client import AgentState
from service.agent.trust import Trust
from service.clock import ManualClock
from service.signing import FRESHNESS_MEDIA_TYPE, KeyStore, b64json, freshness_claims, plan_claims, plan_digest

NODE = "gpu-01"
ARGV = ["vllm", "serve", "s3://llama-8b", "--max-model-len", "8192"]


def signed(
    store: KeyStore,
    clock: ManualClock,
    *,
    plan_id="p-1",
    seq=1,
    node=NODE,
    ttl=600,
    placement=None,
    env=None,
    plan_age=0,
    argv=ARGV,
    acked_seq=0,
) -> tuple[str, str]:
    """A plan (issued ``plan_age`` seconds ago) and its freshness statement, signed at the clock's time."""
    now = int(clock.time())
    token = store.sign(
        plan_claims(
            issuer="preflight",
            audience="preflight-agent",
            node=node,
            plan_id=plan_id,
            seq=seq,
            manifest_digest="sha256:00",
            vllm_version="0.33.0",
            argv=argv,
            env=env or {},
            model_uri="s3://llama-8b",
            placement=placement,
            now=now - plan_age,
        )
    )
    fresh = store.sign(
        freshness_claims(
            issuer="preflight",
            audience="preflight-agent",
            node=node,
            plan_id=plan_id,
            seq=seq,
            digest=plan_digest(token),
            ttl=ttl,
            acked_seq=acked_seq,
            now=now,
            grouped=placement is not None,
            head_group_digest=(placement or {}).get("group_digest"),
        ),
        typ=FRESHNESS_MEDIA_TYPE,
    )
    return token, fresh


def served(token: str, fresh: str, plan_id="p-1") -> httpx.Response:
    return httpx.Response(
        200, text=token, headers={"X-Plan-Id": plan_id, "X-Plan-Freshness": fresh, "ETag": f'"{plan_id}"'}
    )


def not_modified(store: KeyStore, clock: ManualClock, token: str, plan_id="p-1", seq=1) -> httpx.Response:
    """The saved plan is still current: 304, with a freshness statement signed now."""
    fresh = store.sign(
        freshness_claims(
            issuer="preflight",
            audience="preflight-agent",
            node=NODE,
            plan_id=plan_id,
            seq=seq,
            digest=plan_digest(token),
            ttl=600,
            acked_seq=0,
            now=int(clock.time()),
        ),
        typ=FRESHNESS_MEDIA_TYPE,
    )
    return httpx.Response(304, headers={"X-Plan-Freshness": fresh, "ETag": f'"{plan_id}"'})


def group_hold(final=False) -> httpx.Response:
    return httpx.Response(
        409,
        headers={"Retry-After": "5"},
        json={
            "type": "https://preflight.dev/problems/group-hold",
            "title": "Held",
            "status": 409,
            "hold": {
                "reason": "head_pending",
                "message": "the head head-1 has not started plan p-2 (group 0) yet",
                "final": final,
                "head": "head-1",
                "head_report": None,
                "plan_id": "p-2",
            },
        },
    )


def with_nonce(store: KeyStore, r: httpx.Response, nonce: str) -> httpx.Response:
    """``r`` with its freshness statement signed again, echoing ``nonce`` — what the service does for the fetch
    that sent it. A statement signed by a key ``store`` does not hold is left as it is."""
    fresh = r.headers.get("X-Plan-Freshness")
    if not fresh or b64json(fresh.split(".")[0]).get("kid") not in store.published():
        return r
    claims = {**b64json(fresh.split(".")[1]), "nonce": nonce}
    headers = {k: v for k, v in r.headers.items() if k != "x-plan-freshness"}
    headers["X-Plan-Freshness"] = store.sign(claims, typ=FRESHNESS_MEDIA_TYPE)
    return httpx.Response(r.status_code, content=r.content, headers=headers)


class FakeService:
    """Answers the agent's calls from a script: ``answers`` for the plan fetches (the last one repeats), their
    freshness statements echoing the fetch's nonce as the service would (``replayed``: served exactly as
    scripted, an answer captured earlier), nothing to add to the trust root, no audit checkpoint; records reports
    and facts. ``down``: every call fails to connect (True), or the first ``down`` calls do."""

    def __init__(self, *answers, down=False, replayed=False):
        self.answers, self.down, self.replayed = list(answers), down, replayed
        self.signer: KeyStore | None = None  # the node's service keys (Node.boot sets them)
        self.reports: list[dict] = []
        self.facts: list[dict] = []
        self.fetches = 0
        self.nonces: list[str | None] = []

    def _reach(self):
        if self.down is True:
            raise httpx.ConnectError("connection refused")
        if self.down:
            self.down -= 1
            raise httpx.ConnectError("connection refused")

    def keysets(self, after):
        self._reach()
        return []

    def audit_checkpoint(self):
        self._reach()
        return None

    def fetch(self, etag=None, nonce=None):
        self._reach()
        self.fetches += 1
        self.nonces.append(nonce)
        r = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return r if self.replayed or nonce is None or self.signer is None else with_nonce(self.signer, r, nonce)

    def post_report(self, body):
        self._reach()
        self.reports.append(body)
        return httpx.Response(201, json={"current": True})

    def put_facts(self, facts):
        self._reach()
        self.facts.append(facts)
        return httpx.Response(200, json=facts)

    def post_metrics(self, body):
        raise AssertionError("metrics are off in these tests")

    def statuses(self):
        return [r["status"] for r in self.reports]


class FakeProbe:
    def __init__(self, refusal=None, facts=None):
        self.refusal, self.facts_seen, self.checked = refusal, facts or {"gpu_count": 8}, []

    provenance: dict | None = None  # what a weights signature check found (agent/provenance.py)

    def check(self, claims, *, say, found=None):
        self.checked.append(claims["jti"])
        if self.provenance is not None and found is not None:
            found["provenance"] = self.provenance
        return self.refusal

    def facts(self):
        return self.facts_seen


class Node:
    """One node's files and the fakes a boot is given; ``boot(service, **options)`` runs one boot."""

    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.store = KeyStore(tmp_path / "keys")
        self.trust = tmp_path / "trust.json"
        self.trust.write_text(json.dumps(self.store.jwks()))
        self.state = tmp_path / "state.json"
        self.clock = ManualClock()
        self.probe = FakeProbe()
        self.child_status = 0
        self.children: list[tuple[list[str], dict]] = []
        self.reexecs = 0
        self.said: list[str] = []
        self.printed: list[str] = []
        self.environ = {"HOME": "/root", "PREFLIGHT_TOKEN": "secret"}

    def run_child(self, argv, env, report, **kw):
        self.children.append((argv, env))
        report("started", "pid 1", {"pid": 1})
        report("exited", "vLLM exited", {"status": self.child_status})
        return self.child_status

    def reexec(self):
        self.reexecs += 1

    def boot(self, service, **options):
        opts = BootOptions(
            node=NODE,
            state_path=self.state,
            checkpoint_copy=self.dir / "state.checkpoint.jws",
            metrics_seconds=0,
            **options,
        )
        self.said.clear()
        if isinstance(service, FakeService):
            service.signer = self.store
        return Boot(
            opts,
            client=service,
            trust=Trust.load(self.trust),
            clock=self.clock,
            probe=self.probe,
            run_child=self.run_child,
            reexec=self.reexec,
            err=self.said.append,
            out=self.printed.append,
            environ=self.environ,
        ).run()

    def saved(self) -> AgentState:
        return AgentState.load(self.state)

    def stderr(self) -> str:
        return "\n".join(self.said)


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path)


def test_print_verifies_saves_and_reports_with_the_clocks_time(node):
    token, fresh = signed(node.store, node.clock)
    service = FakeService(served(token, fresh))
    out = node.boot(service)
    assert (out.code, out.step) == (0, "printed")
    assert node.printed == [" ".join(ARGV)]
    st = node.saved()
    assert (st.last_seq, st.plan_id, st.plan, st.verified_at) == (1, "p-1", token, node.clock.time())
    assert service.statuses() == ["fetched"]
    assert service.reports[0]["details"]["at"] == round(node.clock.time(), 3)


def test_a_group_hold_gives_up_after_group_wait_without_real_sleeping(node):
    service = FakeService(group_hold())
    started = time.monotonic()
    out = node.boot(service, group_wait=120.0)
    assert (out.code, out.step) == (75, "unavailable")
    assert time.monotonic() - started < 5  # the clock advanced by the waits, nothing slept
    assert node.clock.monotonic() == pytest.approx(120.0)
    assert service.fetches > 3 and service.reports == []  # held: retried with backoff (capped by Retry-After)
    said = node.stderr()
    assert said.count("HOLD p-2: the head head-1 has not started plan p-2 (group 0) yet (at most 120 s") == 1
    assert "gave up after 120 s (--group-wait 120)" in said and "vLLM was not started" in said
    assert not node.state.exists() and node.children == []


def test_a_final_group_hold_is_refused_and_reported(node):
    service = FakeService(group_hold(final=True))
    out = node.boot(service)
    assert (out.code, out.step) == (3, "refused")
    [refused] = service.reports
    assert refused["status"] == "refused" and refused["plan_id"] == "p-2"
    assert refused["details"]["check"] == "group" and refused["details"]["reason"] == "head_pending"


def saved_plan(node, *, age: float) -> str:
    """Boot once online (a plan issued an hour ago, confirmed current now: verified and saved), then move the clock
    ``age`` seconds on (back when negative: a node whose clock was set back since)."""
    token, fresh = signed(node.store, node.clock, plan_age=3600)
    assert node.boot(FakeService(served(token, fresh))).code == 0
    node.clock.advance(age)
    return token


@pytest.mark.parametrize(
    "age, max_age, code",
    [
        (3599, 3600, 0),
        (3600, 3600, 0),
        (3601, 3600, 75),
        (-CLOCK_SKEW_SECONDS, 3600, 0),
        (-CLOCK_SKEW_SECONDS - 1, 3600, 75),  # confirmed "in the future": 300 s margin
        (10, 0, 75),  # 0: offline boot disabled
    ],
)
def test_offline_boot_by_the_age_of_the_last_confirmation(node, age, max_age, code):
    token = saved_plan(node, age=age)
    out = node.boot(FakeService(down=True), offline_max_age=max_age)
    assert out.code == code, node.stderr()
    if code == 0:
        said = f"OFFLINE BOOT of the last verified plan p-1 (seq 1, confirmed current {int(age)} s ago)"
        assert said in node.stderr()
        assert node.printed[-1] == " ".join(ARGV)
    elif max_age == 0:
        assert "offline boot is disabled (--offline-max-age 0): nothing runs" in node.stderr()
    elif age > 0:
        assert f"last confirmed {age} s ago, more than --offline-max-age {max_age} s: nothing runs" in node.stderr()
    assert node.saved().plan == token  # an offline boot never changes the saved plan


def test_an_offline_exec_queues_its_reports_for_the_next_boot(node):
    token = saved_plan(node, age=600)
    out = node.boot(FakeService(down=True), print_only=False, vllm_path="/opt/vllm/bin/vllm")
    assert (out.code, out.step) == (0, "exited")
    pending = node.saved().pending
    assert [p["status"] for p in pending] == ["started", "exited"]
    assert pending[0]["details"]["offline_boot"]["age_seconds"] == 600
    back = FakeService(not_modified(node.store, node.clock, token))
    assert node.boot(back).code == 0  # the service answers again: the queue goes out first
    assert back.statuses() == ["started", "exited"] and node.saved().pending == []


def test_a_group_member_never_boots_offline(node):
    placement = {"group": 0, "rank": 1, "role": "worker", "nnodes": 2, "head": "head-1", "group_digest": "g" * 64}
    token, fresh = signed(node.store, node.clock, placement=placement, argv=ARGV + ["--headless"])
    assert node.boot(FakeService(served(token, fresh))).code == 0
    out = node.boot(FakeService(down=True))
    assert out.code == 75 and "REFUSED freshness p-1: group_offline" in node.stderr()
    # with --wait it waits for the service's word instead (never an offline boot it would refuse)
    token, fresh = signed(node.store, node.clock, placement=placement, argv=ARGV + ["--headless"])
    back = FakeService(served(token, fresh), down=2)  # the key sets and the first fetch fail
    assert node.boot(back, wait=True, poll_seconds=5).code == 0
    assert "a multi-node group member's, which never boots offline; waiting" in node.stderr()
    assert node.clock.monotonic() == 5 and back.fetches == 1


def test_a_refused_plan_is_reported_with_its_reason_and_changes_nothing(node):
    other = KeyStore(node.dir / "other-keys")  # a service with keys this node does not trust
    token, fresh = signed(other, node.clock)
    service = FakeService(served(token, fresh))
    out = node.boot(service)
    assert (out.code, out.step) == (3, "refused")
    [refused] = service.reports
    assert refused["status"] == "refused" and refused["plan_id"] == "p-1"
    assert refused["details"]["check"] == "plan" and refused["details"]["reason"] == "unknown_kid"
    assert refused["message"].startswith("plan refused: unknown_kid")
    assert "REFUSED plan p-1: unknown_kid" in node.stderr()
    assert not node.state.exists() and node.printed == []


def test_a_statement_that_expired_on_the_way_is_refused_as_stale(node):
    token, fresh = signed(node.store, node.clock, ttl=600)
    node.clock.advance(601)  # delivered (or replayed) after its lifetime
    service = FakeService(served(token, fresh))
    assert node.boot(service).code == 3
    [refused] = service.reports
    assert (refused["details"]["check"], refused["details"]["reason"]) == ("freshness", "stale")


def test_a_superseded_run_boots_again(node):
    token, fresh = signed(node.store, node.clock)
    node.child_status = runner.SUPERSEDED
    service = FakeService(served(token, fresh))
    out = node.boot(service, print_only=False, vllm_path="/opt/vllm/bin/vllm")
    assert (out.code, out.step) == (0, "superseded") and node.reexecs == 1
    assert "the plan is no longer current; booting again" in node.stderr()
    [(argv, env)] = node.children
    assert argv == ["/opt/vllm/bin/vllm", *ARGV[1:]]  # the node's vllm, the plan's arguments
    assert env == {"HOME": "/root"}  # the agent's own settings never reach vLLM
    assert service.statuses() == ["fetched", "started", "exited"] and node.probe.checked == ["p-1"]


def test_the_started_report_carries_the_weights_provenance(node):
    # what the node checks found of the weights' signature reaches the service (and so the audit) with started
    token, fresh = signed(node.store, node.clock)
    node.probe.provenance = {"status": "verified", "message": "/w/model.sig verified", "file": "/w/model.sig"}
    service = FakeService(served(token, fresh))
    out = node.boot(service, print_only=False, vllm_path="/opt/vllm/bin/vllm")
    assert out.code == 0 and service.statuses() == ["fetched", "started", "exited"]
    started, exited = service.reports[1], service.reports[2]
    assert started["details"]["provenance"] == node.probe.provenance and started["details"]["pid"] == 1
    assert "provenance" not in exited["details"]


def test_the_nodes_own_variables_win_over_the_plans(node):
    # the node keeps its own API key: a plan's VLLM_API_KEY="" would otherwise open the API to anyone
    node.environ = {"HOME": "/root", "VLLM_API_KEY": "node-key", "PREFLIGHT_TOKEN": "secret"}
    token, fresh = signed(node.store, node.clock, env={"VLLM_API_KEY": "", "NCCL_DEBUG": "INFO"})
    out = node.boot(FakeService(served(token, fresh)), print_only=False, vllm_path="/opt/vllm/bin/vllm")
    assert out.code == 0
    [(_, env)] = node.children
    assert env == {"HOME": "/root", "VLLM_API_KEY": "node-key", "NCCL_DEBUG": "INFO"}
    assert "the node's own VLLM_API_KEY kept" in node.stderr()


def test_a_node_check_refusal_sends_the_observed_facts_and_the_next_boot_restores_them(node):
    token, fresh = signed(node.store, node.clock)
    node.probe = FakeProbe(
        Refusal("gpus", "inventory_drift", "7 GPUs, not 8", {"differences": ["count"]}, observed_facts={"gpu_count": 7})
    )
    service = FakeService(served(token, fresh))
    out = node.boot(service, print_only=False, vllm_path="/opt/vllm/bin/vllm")
    assert (out.code, out.step) == (3, "refused") and node.children == []
    assert service.statuses() == ["fetched", "refused"] and service.reports[1]["details"]["check"] == "gpus"
    assert service.facts == [{"gpu_count": 7}] and node.saved().facts_drifted
    node.probe = FakeProbe(facts={"gpu_count": 8})  # the GPU is back
    again = FakeService(not_modified(node.store, node.clock, token))
    assert node.boot(again, print_only=False, vllm_path="/opt/vllm/bin/vllm").code == 0
    assert again.facts == [{"gpu_count": 8}] and not node.saved().facts_drifted


def test_no_plan_yet_waits_on_the_clock_then_boots(node):
    token, fresh = signed(node.store, node.clock)
    none = httpx.Response(404, json={"detail": f"node {NODE} has no current plan"})
    service = FakeService(none, none, served(token, fresh))
    out = node.boot(service, wait=True, poll_seconds=30)
    assert out.code == 0 and node.clock.monotonic() == 60
    assert node.stderr().count("has no plan yet; waiting") == 1


def test_a_corrupt_state_is_set_aside_under_the_clocks_time(node):
    node.state.write_text('{"last_seq": tru')
    token, fresh = signed(node.store, node.clock)
    service = FakeService(served(token, fresh))
    assert node.boot(service).code == 0
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(node.clock.time()))
    assert (node.dir / f"state.json.corrupt-{stamp}").exists()
    assert service.statuses() == ["reset", "fetched"]
    assert service.reports[0]["details"]["reason"] == "state_corrupt"


def test_a_queued_report_without_a_status_is_dropped_not_a_crash(node):
    # a hand-edited or damaged state file: a queued "report" with no status is no report; sending it drew a 422 and
    # the agent then crashed on body['status'] at every boot
    token = saved_plan(node, age=60)
    st = node.saved()
    st.pending = [{"details": {}}, {"status": 7}, {"status": "exited", "plan_id": "p-1", "details": {}}]
    st.save()

    class Refusing(FakeService):
        def post_report(self, body):
            self.reports.append(body)
            ok = isinstance(body.get("status"), str)
            return httpx.Response(201 if ok else 422, json={"current": True} if ok else {"status": 422})

    back = Refusing(not_modified(node.store, node.clock, token))
    out = node.boot(back)
    assert (out.code, out.step) == (0, "printed"), node.stderr()
    assert back.statuses() == ["exited"] and node.saved().pending == []


def roll_back_state(node, last_seq: int, plan_id: str | None = None, plan: str | None = None) -> None:
    """What a writer of the node's state file can do: lower ``last_seq`` (and name an older plan)."""
    data = json.loads(node.state.read_text())
    data.update(last_seq=last_seq, plan_id=plan_id, plan=plan, etag=None)
    node.state.write_text(json.dumps(data))


def test_an_older_plan_and_its_statement_replayed_after_a_state_rollback_are_refused(node):
    """The node ran p-1 (seq 1), then p-2 (seq 2). Its state file lowered to seq 1 (or emptied), the answer it got
    for p-1 — plan and freshness statement, still within its lifetime — is replayed: the statement does not echo
    this fetch's nonce, so nothing runs and the state is not changed."""
    old_token, old_fresh = signed(node.store, node.clock, plan_id="p-1", seq=1)
    captured = served(old_token, old_fresh, plan_id="p-1")
    assert node.boot(FakeService(captured)).code == 0
    node.clock.advance(60)
    token, fresh = signed(node.store, node.clock, plan_id="p-2", seq=2, acked_seq=1)
    assert node.boot(FakeService(served(token, fresh, plan_id="p-2"))).code == 0
    for lowered in (1, 0):
        roll_back_state(node, lowered, "p-1" if lowered else None, old_token if lowered else None)
        replay = FakeService(captured, replayed=True)
        out = node.boot(replay)
        assert (out.code, out.step) == (3, "refused"), node.stderr()
        [refused] = replay.reports
        assert (refused["details"]["check"], refused["details"]["reason"]) == ("freshness", "freshness_replayed")
        assert replay.nonces[0] is not None and len(replay.nonces[0]) >= 16
        assert node.saved().last_seq == lowered and node.printed[-1] == " ".join(ARGV)  # printed by the p-2 boot


def test_a_plan_below_the_seq_the_service_recorded_as_acknowledged_is_refused_whatever_the_state_says(node):
    """A freshness statement signed for this very fetch (the nonce echoed) that names seq 1 while saying the node
    already reported on seq 2 — a service serving an older assignment: refused even from an emptied or lowered
    state file, which alone would accept seq 1."""
    token, fresh = signed(node.store, node.clock, plan_id="p-1", seq=1, acked_seq=2)
    for lowered in (False, True):  # no state file, then one lowered to seq 0
        if lowered:
            node.state.write_text(json.dumps({"last_seq": 0}))
        service = FakeService(served(token, fresh))
        out = node.boot(service)
        assert (out.code, out.step) == (3, "refused")
        [refused] = service.reports
        assert (refused["details"]["check"], refused["details"]["reason"]) == ("freshness", "below_acked_seq")
        assert (
            "seq 1 (plan p-1) is below seq 2, which the service recorded this node already reporting on"
            in (refused["message"])
        )
    assert node.printed == [] and (not node.state.exists() or node.saved().last_seq == 0)


def test_the_acknowledged_seq_itself_runs_again(node):
    """The node's current plan, already reported on (acked_seq = its seq), runs again at every boot."""
    token, fresh = signed(node.store, node.clock, plan_id="p-3", seq=3, acked_seq=3)
    service = FakeService(served(token, fresh, plan_id="p-3"))
    assert node.boot(service).code == 0 and node.saved().last_seq == 3
    assert service.statuses() == ["fetched"]
