"""The node agent's boot, one step per method: the trust root brought up to date through the service's signed key-set
chain, the audit log witnessed, the node's plan fetched (held while a multi-node group's head is not ready, waited
for with ``--wait``, or the last verified plan booted offline within ``--offline-max-age``), verified with its
freshness statement, then printed, or checked against the node (GPUs, weights, free memory), run and supervised —
and booted again, the same way a restart would, when the service says the plan is no longer current.

Everything the boot touches outside itself is handed in: the HTTP client (``AgentClient``), the clock (every time it
reads: the offline age, the group hold, the reports' ``at``, verification), the node's checks (nvidia-smi and the
weights on disk), the process runner and the re-exec. Tests drive it with fakes of each; ``preflight agent run``
builds it with the real ones and exits with the ``Outcome``'s code.
"""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import secrets
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from ..clock import SYSTEM, Clock
from . import EXIT_REFUSED, EXIT_UNAVAILABLE
from . import runner as runner_mod
from .client import AgentState, ResponseTooLarge, StateCorrupt
from .reports import Reporter, say_stderr
from .verify import VerificationError, VerifiedPlan, verify_freshness, verify_plan

STALE_NO_STATE_SECONDS = 120  # without state, only a freshness statement signed this recently is accepted
CLOCK_SKEW_SECONDS = 300  # an offline boot accepts a plan confirmed up to this far in the node's future


@dataclass(frozen=True)
class BootOptions:
    """What ``preflight agent run`` was told (see its options)."""

    node: str
    state_path: pathlib.Path
    checkpoint_copy: pathlib.Path  # where the node keeps the longest audit checkpoint it has seen
    issuer: str = "preflight"
    audience: str = "preflight-agent"
    print_only: bool = True
    wait: bool = False
    poll_seconds: float = 30.0
    vllm_path: str | None = None  # the node's vllm (resolved by the command; None with --print)
    offline_max_age: float = 7 * 86400
    heartbeat_seconds: float = 60.0
    group_wait: float = 600.0
    metrics_seconds: float = 60.0
    metrics_url: str | None = None


@dataclass(frozen=True)
class Outcome:
    """How a boot ended: the agent's exit status and the step that decided it (printed, exited, refused,
    unavailable, no_plan, fetch_failed, superseded)."""

    code: int
    step: str


class Stop(Exception):
    """A step ended the boot (its message is already said)."""

    def __init__(self, code: int, step: str):
        super().__init__(step)
        self.code, self.step = code, step


def reexec_self() -> None:
    """Boot again in a new process image, with the same arguments (a new plan, or none, is fetched again)."""
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "service.cli", *sys.argv[1:]])


def print_stdout(line: str) -> None:
    print(line, flush=True)


class Boot:
    """One boot of the node agent (see the module's docstring). ``run()`` returns the Outcome; nothing raises out of
    it for a refusal or an unreachable service."""

    def __init__(
        self,
        options: BootOptions,
        *,
        client,
        trust,
        clock: Clock = SYSTEM,
        probe=None,
        run_child: Callable[..., int] = runner_mod.run,
        reexec: Callable[[], None] = reexec_self,
        err: Callable[[str], None] = say_stderr,
        out: Callable[[str], None] = print_stdout,
        environ: Mapping[str, str] = os.environ,
    ):
        self.options, self.client, self.trust, self.clock = options, client, trust, clock
        self.probe = probe  # the node's checks (agent/bootcheck.py NodeProbe); needed with --exec only
        self.run_child, self.reexec, self.err, self.out, self.environ = run_child, reexec, err, out, environ
        self.state = AgentState(path=options.state_path)
        self.lost: str | None = None  # why the state file was set aside (no offline boot then)
        self.started = 0.0
        self.reachable = False
        self.said: Any = None  # the last waiting message, said once per change
        self.held_since: float | None = None
        self.hold_delay = 1.0
        self.nonce: str | None = None  # sent with the last fetch; its answer's freshness statement must echo it
        self.found: dict[str, Any] = {}  # what the node checks learned for the started report (provenance)

    def say(self, line: str) -> None:
        self.err(f"preflight agent: {line}")

    def reporter(self, **kw) -> Reporter:
        return Reporter(self.client, self.state, clock=self.clock, say=self.err, **kw)

    def run(self) -> Outcome:
        try:
            return self._boot()
        except Stop as stop:
            return Outcome(stop.code, stop.step)

    def _boot(self) -> Outcome:
        self.started = self.clock.time()
        self.load_state()
        self.reachable = self.update_trust()
        witnessed = self.witness_audit() if self.reachable else None
        if self.lost:
            self.reporter(plan_id=None, seq=None)(
                "reset", "agent state reset: " + self.lost, {"reason": "state_corrupt"}
            )
        r = self.fetch_plan()
        plan, offline, new = self.accept_plan(r)
        report = self.reporter(
            plan_id=plan.claims["jti"],
            seq=plan.seq,
            offline=offline,
            send_pending=True,
            placement={k: plan.claims[k] for k in ("group", "rank", "role") if k in plan.claims},
        )
        if witnessed is not None:
            report.audit_checkpoint = witnessed.details()
        if new:
            report("fetched", f"verified seq {plan.seq} with key {plan.kid}")
        if self.options.print_only:
            return self.print_command(plan, report)
        if not self.node_checks_pass(plan.claims, report):
            report.close()
            return Outcome(EXIT_REFUSED, "refused")
        code = self.supervise(plan, report)
        if code == runner_mod.SUPERSEDED:  # a new plan (or none): boot again, the same way a restart would
            self.say("the plan is no longer current; booting again")
            self.reexec()
            return Outcome(0, "superseded")  # only when the re-exec is a test's
        return Outcome(code, "exited")

    # -- state, trust root, audit witness ---------------------------------------------------------------------------

    def load_state(self) -> None:
        """The state file; an unusable one is set aside and the boot starts from an empty state (then only a plan
        the service confirms current right now may run, and no offline boot)."""
        path = self.options.state_path
        try:
            self.state = AgentState.load(path)
        except StateCorrupt as exc:
            aside = AgentState(path=path).set_aside(now=self.clock.time())
            self.lost = f"state file unusable ({exc}); set aside as {aside}"
            self.say(
                f"{self.lost}. Starting from an empty state: only a plan the service confirms current right "
                f"now may run, and no offline boot."
            )
            self.state = AgentState(path=path)

    def refuse(self, plan_id: str | None, exc: VerificationError, check: str) -> None:
        self.say(f"REFUSED {check}{' ' + plan_id if plan_id else ''}: {exc}")
        self.reporter(plan_id=plan_id, seq=None)(
            "refused", f"{check} refused: {exc}", {"reason": exc.reason, "check": check}
        )

    def update_trust(self) -> bool:
        """Apply the key sets the service publishes above the pinned version, each signed by a key trusted at that
        point; a key set that does not chain is refused and the trust file stays as it was. False when the service
        cannot be reached."""
        try:
            try:
                statements = self.client.keysets(self.trust.version)
            except ResponseTooLarge as exc:
                raise VerificationError("keyset_too_large", str(exc)) from None
            applied = self.trust.apply_chain(statements)
            if applied:
                self.say(f"trust root updated to key set version {applied[-1]}")
        except VerificationError as exc:
            self.refuse(None, exc, "key set")
        except httpx.HTTPError:
            return False
        return True

    def witness_audit(self):
        """The node keeps the longest audit checkpoint it has seen (agent/witness.py) and says when the service's
        chain got shorter or was rewritten. Never in the way of the boot."""
        from .witness import witness

        copy = self.options.checkpoint_copy
        try:
            served = self.client.audit_checkpoint()
        except (httpx.HTTPError, ResponseTooLarge):
            return None
        if served is None:
            return None
        try:
            w = witness(copy, served, self.trust.jwks)
        except OSError as exc:
            self.say(f"could not keep the audit checkpoint in {copy}: {exc}")
            return None
        if w.status in ("cut", "rewritten"):
            self.say(
                f"AUDIT ALARM: {w.message} (copy kept in {copy}; check the database with `preflight audit "
                f"verify --checkpoint {copy}`)"
            )
        elif w.status == "ignored":
            self.say(w.message)
        return w

    # -- the fetch: group hold, waiting, offline ----------------------------------------------------------------------

    def fetch_plan(self) -> httpx.Response | None:
        """The service's answer to this node's plan fetch, with a freshness statement signed at fetch time; or, the
        service being unreachable (None, a 5xx or a 429), when the saved plan may boot offline. Holds, waits (with
        --wait) or stops (Stop) otherwise."""
        while True:
            r = self._fetch_once()
            hold = group_hold(r)
            if hold is not None:  # a worker whose head does not run this plan yet (domain/group_gate.py)
                self._hold(hold)
            elif r is not None and r.status_code < 500 and r.status_code != 429:
                if not self._no_plan_yet(r):
                    return r
            elif self._may_boot_offline() and not (self.options.wait and group_member(self.state.plan)):
                return r  # a group member is refused offline (accept_plan)
            else:
                self._unreachable(r)

    def _fetch_once(self) -> httpx.Response | None:
        st = self.state
        if not (self.reachable or self.options.wait):
            return None
        self.nonce = secrets.token_urlsafe(16)  # a new one per fetch: only this fetch's answer echoes it
        try:
            return self.client.fetch(st.etag if st.plan else None, nonce=self.nonce)
        except httpx.HTTPError:
            return None
        except ResponseTooLarge as exc:
            self.refuse(None, VerificationError("too_large", str(exc)), "plan")
            raise Stop(EXIT_REFUSED, "refused") from None

    def _hold(self, hold: dict) -> None:
        """Wait while the service withholds a group member's plan: at most --group-wait (without --wait), never
        past a final refusal."""
        o = self.options
        now = self.clock.monotonic()
        self.held_since = now if self.held_since is None else self.held_since
        waited = now - self.held_since
        if hold["final"] and not o.wait:
            self.say(f"REFUSED group {hold['plan_id']}: {hold['message']}. vLLM was not started.")
            self.reporter(plan_id=hold["plan_id"], seq=None)(
                "refused",
                f"group refused: {hold['message']}",
                {"reason": hold["reason"], "check": "group", "head": hold["head"], "head_report": hold["head_report"]},
            )
            raise Stop(EXIT_REFUSED, "refused")
        if not o.wait and waited >= o.group_wait:
            self.say(
                f"gave up after {int(waited)} s (--group-wait {int(o.group_wait)}): {hold['message']}. vLLM was "
                f"not started."
            )
            raise Stop(EXIT_UNAVAILABLE, "unavailable")
        if self.said != ("hold", hold["reason"], hold["head_report"]):
            self.say(
                f"HOLD {hold['plan_id']}: {hold['message']}"
                f"{'' if o.wait else f' (at most {int(o.group_wait)} s, --group-wait)'}"
            )
            self.said = ("hold", hold["reason"], hold["head_report"])
        delay = min(self.hold_delay, hold["retry_after"])
        self.clock.sleep(delay if o.wait else max(0.0, min(delay, o.group_wait - waited)))
        self.hold_delay *= 1.5

    def _no_plan_yet(self, r: httpx.Response) -> bool:
        """After the service said the node has no current plan: the saved plan may no longer boot offline; with
        --wait, wait (True: fetch again)."""
        no_plan = r.status_code == 404 and "has no current plan" in r.text
        if no_plan and self.state.verified_at is not None:  # the saved plan is not current (revoked)
            self.state.verified_at = None
            self.state.save()
        if not (no_plan and self.options.wait):
            return False
        if self.said != 404:
            self.say(f"{self.options.node} has no plan yet; waiting")
            self.said = 404
        self.clock.sleep(self.options.poll_seconds)
        return True

    def offline_age(self) -> float | None:
        """Seconds since the service last confirmed the saved plan current (None: never)."""
        return self.started - self.state.verified_at if self.state.verified_at else None

    def _may_boot_offline(self) -> bool:
        age, o = self.offline_age(), self.options
        return bool(
            self.state.plan
            and not self.lost
            and o.offline_max_age > 0
            and age is not None
            and -CLOCK_SKEW_SECONDS <= age <= o.offline_max_age
        )

    def _unreachable(self, r: httpx.Response | None) -> None:
        """The service cannot be reached (or fails) and no offline boot applies: stop, or with --wait wait and try
        again (the trust root first)."""
        o, st, age = self.options, self.state, self.offline_age()
        why = (
            "the saved plan is a multi-node group member's, which never boots offline"
            if self._may_boot_offline()
            else "no verified plan is saved"
            if not st.plan
            else "offline boot is disabled (--offline-max-age 0)"
            if o.offline_max_age <= 0
            else f"the saved plan was last confirmed {int(age or 0)} s ago, more than "
            f"--offline-max-age {int(o.offline_max_age)} s"
        )
        if not o.wait:
            self.say(
                f"the service is unreachable{f' (HTTP {r.status_code})' if r is not None else ''} and {why}: "
                f"nothing runs"
            )
            raise Stop(EXIT_UNAVAILABLE, "unavailable")
        if self.said != "offline":
            self.say(f"the service is unreachable and {why}; waiting")
            self.said = "offline"
        self.clock.sleep(o.poll_seconds)
        self.reachable = self.update_trust()

    # -- the plan: which token, verification, the offline boot --------------------------------------------------------

    def accept_plan(self, r: httpx.Response | None) -> tuple[VerifiedPlan, dict | None, bool]:
        """The verified plan, the offline boot it is (None: confirmed current now) and whether it is new."""
        token, header_id, offline = self._plan_token(r)
        try:
            plan = verify_plan(
                token,
                self.trust.jwks,
                node=self.options.node,
                audience=self.options.audience,
                issuer=self.options.issuer,
                last_seq=self.state.last_seq,
                last_plan_id=self.state.plan_id,
                now=self.clock.time(),
            )
        except VerificationError as exc:
            self.refuse(header_id, exc, "plan")
            raise Stop(EXIT_REFUSED, "refused") from None
        if offline is None:
            assert r is not None  # an answer: _plan_token's offline boot is the only one without
            self._confirm_fresh(r, token, plan)
            return plan, None, r.status_code == 200
        if plan.grouped:  # the freshness statement is what says the head holds the same group plan
            self.refuse(
                plan.claims["jti"],
                VerificationError(
                    "group_offline",
                    f"the service is unreachable and this node is the {plan.role} (rank "
                    f"{plan.claims['rank']}) of a {plan.claims['nnodes']}-node group: it boots only with the service's "
                    f"word that its head holds the same group plan, never offline",
                ),
                "freshness",
            )
            raise Stop(EXIT_UNAVAILABLE, "unavailable")
        # said once the saved plan verified and may boot offline (never before a refusal)
        self.say(
            f"the service is unreachable: OFFLINE BOOT of the last verified plan {self.state.plan_id} (seq "
            f"{self.state.last_seq}, confirmed current {offline['age_seconds']} s ago)"
        )
        return plan, offline, False

    def _plan_token(self, r: httpx.Response | None) -> tuple[str, str | None, dict | None]:
        """(the plan's JWS, the plan id the answer names — unverified —, the offline boot or None)."""
        st = self.state
        if r is None or r.status_code >= 500 or r.status_code == 429:  # fetch_plan allowed an offline boot
            assert st.plan is not None and st.verified_at is not None  # _may_boot_offline: a saved, verified plan
            return (
                st.plan,
                st.plan_id,
                {
                    "plan_verified_at": dt.datetime.fromtimestamp(st.verified_at, dt.UTC).isoformat(),
                    "age_seconds": int(self.started - st.verified_at),
                },
            )
        if r.status_code == 304 and st.plan:
            return st.plan, st.plan_id, None
        if r.status_code == 200:
            header_id = r.headers.get("X-Plan-Id") or None
            return r.text, header_id if header_id and len(header_id) <= 36 else None, None
        if r.status_code == 404 and "has no current plan" in r.text:
            self.say(f"{self.options.node} has no current plan: nothing runs (--wait waits for one)")
            raise Stop(1, "no_plan")
        detail = r.text[:500]
        try:
            body = r.json()
            detail = str(body.get("detail", detail))[:500] if isinstance(body, dict) else detail
        except (ValueError, RecursionError):
            pass
        self.say(f"fetch failed: HTTP {r.status_code}: {detail}")
        raise Stop(1, "fetch_failed")

    def _confirm_fresh(self, r: httpx.Response, token: str, plan: VerifiedPlan) -> None:
        """The freshness statement served with the plan, then the plan saved as this node's last verified one."""
        o, st = self.options, self.state
        try:
            fresh = verify_freshness(
                r.headers.get("X-Plan-Freshness", ""),
                self.trust.jwks,
                plan_token=token,
                plan=plan,
                node=o.node,
                audience=o.audience,
                issuer=o.issuer,
                not_before=self.started - STALE_NO_STATE_SECONDS if st.last_seq == 0 else None,
                now=self.clock.time(),
                nonce=self.nonce,
            )
        except VerificationError as exc:
            self.refuse(plan.claims["jti"], exc, "freshness")
            raise Stop(EXIT_REFUSED, "refused") from None
        # the plan was confirmed current when the service signed the statement, not when this node read it: a
        # statement replayed near its expiry must not restart the offline-boot clock
        st.last_seq, st.plan_id, st.plan = plan.seq, plan.claims["jti"], token
        st.verified_at = float(max(0, min(self.clock.time(), fresh["iat"])))
        st.etag = r.headers.get("ETag") or st.etag
        st.save()

    # -- print, node checks, run --------------------------------------------------------------------------------------

    def print_command(self, plan: VerifiedPlan, report: Reporter) -> Outcome:
        env_line = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(plan.claims["env"].items()))
        self.out((env_line + " " if env_line else "") + shlex.join(plan.argv))
        report.flush()  # the service answered: what an offline boot queued is delivered now, not at the next --exec
        report.keep_undelivered()
        return Outcome(0, "printed")

    def node_checks_pass(self, claims: dict, report: Reporter) -> bool:
        """The GPUs, the weights and the free memory the plan needs (agent/bootcheck.py). A refusal is reported
        (``refused``, details.check/reason and the numbers) and printed; after inventory drift the node's facts are
        updated with what nvidia-smi shows (PUT /v1/nodes/NAME/facts, the agent's own node only)."""
        try:
            refusal = self.probe.check(claims, say=self.say, found=self.found)
        except Exception as exc:  # whatever a node's tools or disk hand back, a check that cannot finish refuses
            from .bootcheck import Refusal

            refusal = Refusal(
                "node checks",
                "check_failed",
                f"a check could not be completed ({exc.__class__.__name__}: {str(exc)[:200]})",
            )
        if refusal is None:
            if self.state.facts_drifted:  # an earlier boot sent drifted facts; the GPUs agree with the plan again
                self._restore_facts()
            return True
        self.say(f"REFUSED {refusal.check} {claims['jti']}: {refusal.message}. vLLM was not started.")
        report(
            "refused",
            f"{refusal.check} refused: {refusal.message}",
            {"reason": refusal.reason, "check": refusal.check, **refusal.details},
        )
        drifted = "the node's facts are updated with what nvidia-smi shows: a new plan is needed"
        if refusal.observed_facts is not None and self._put_facts(refusal.observed_facts, drifted):
            self.state.facts_drifted = True
            self.state.save()
        return False

    def _restore_facts(self) -> None:
        from .gpus import NvidiaSmiError

        try:
            facts = self.probe.facts()
        except (NvidiaSmiError, OSError) as exc:
            self.say(f"could not read the GPUs again to restore the node's facts: {exc}")
            return
        if self._put_facts(facts, "the GPUs are back: the node's facts are updated with what nvidia-smi shows"):
            self.state.facts_drifted = False
            self.state.save()

    def _put_facts(self, facts: dict, done: str) -> bool:
        from ..domain.text import printable

        try:
            r = self.client.put_facts(facts)
        except httpx.HTTPError as exc:
            self.say(f"could not update the node's facts: {exc}")
            return False
        if r.status_code >= 400:
            said = printable(r.text[:300], keep="\n\t")  # the service's text: never a raw control character
            self.say(f"could not update the node's facts: HTTP {r.status_code}: {said}")
            return False
        self.say(done)
        return True

    def supervise(self, plan: VerifiedPlan, report: Reporter) -> int:
        """Run exactly the plan's argv with the node's vllm (never one a plan or its env chooses), report its life,
        and sample vLLM's metrics for the tuning loop. Returns the runner's status (or runner.SUPERSEDED)."""
        o = self.options
        argv = [o.vllm_path, *plan.argv[1:]]
        where = (
            f" as the {plan.role} (rank {plan.claims['rank']} of {plan.claims['nnodes']}, group "
            f"{plan.claims['group']}, head {plan.claims['head']})"
            if plan.grouped
            else ""
        )
        self.say(f"running plan {plan.claims['jti']} (seq {plan.seq}){where} with {o.vllm_path}")
        # the agent's own settings (its token among them) never reach vLLM or the model code it may run; what the
        # node sets for itself (its VLLM_API_KEY, its CUDA_VISIBLE_DEVICES) a plan cannot override
        own = {k: v for k, v in self.environ.items() if not k.startswith("PREFLIGHT_")}
        kept = sorted(k for k, v in plan.claims["env"].items() if k in own and own[k] != v)
        if kept:
            self.say(f"the node's own {', '.join(kept)} kept: a plan does not override what the node sets")
        env = {**plan.claims["env"], **own}
        sampler = self._start_sampler(plan)
        found = dict(self.found)

        def enqueue(status: str, message: str | None = None, details: dict | None = None) -> None:
            # the started report says what the node checks found (the weights' provenance), so the audit has it
            if status == "started" and found:
                details = {**(details or {}), **found}
            report.enqueue(status, message, details)

        try:
            return self.run_child(
                argv,
                env,
                enqueue,
                heartbeat_seconds=o.heartbeat_seconds,
                heartbeat=report.heartbeat,
                clock=self.clock,
            )
        finally:
            if sampler is not None:
                sampler.stop()
            report.close()

    def _start_sampler(self, plan: VerifiedPlan):
        """Windows of vLLM's live metrics for the tuning loop (best effort); a headless worker of a multi-node
        instance serves no API and no /metrics — its head does."""
        o = self.options
        if o.metrics_seconds <= 0 or plan.role == "worker":
            return None
        from .vllm_metrics import Sampler, metrics_url

        return Sampler(
            o.metrics_url or metrics_url(plan.argv),
            plan.claims["jti"],
            self.client.post_metrics,
            seconds=o.metrics_seconds,
            clock=self.clock,
        ).start()


def group_member(token: str | None) -> bool:
    """Whether a saved plan (verified when saved; only read here, to choose to wait) is a multi-node group member's:
    with --wait such a node waits for the service instead of going to an offline boot it would refuse."""
    from ..signing import b64json

    try:
        claims = b64json((token or "").split(".")[1])
    except (ValueError, IndexError, RecursionError, UnicodeDecodeError):
        return False
    return isinstance(claims, dict) and claims.get("role") in ("head", "worker")


def group_hold(r: httpx.Response | None) -> dict | None:
    """The service's 409 ``group-hold`` answer (api/app.py), read defensively: reason, message (printable, bounded),
    final, head, head_report, plan_id and the Retry-After seconds (1..30). None for any other answer."""
    if r is None or r.status_code != 409:
        return None
    try:
        body = r.json()
    except (ValueError, RecursionError):
        return None
    hold = body.get("hold") if isinstance(body, dict) else None
    if not isinstance(hold, dict) or not str(body.get("type", "")).endswith("/group-hold"):
        return None

    def text_of(v, n=300):
        return "".join(ch if ch.isprintable() else "?" for ch in str(v))[:n] if v is not None else None

    try:
        retry = min(30.0, max(1.0, float(r.headers.get("Retry-After", "5"))))
    except ValueError:
        retry = 5.0
    return {
        "reason": text_of(hold.get("reason"), 40),
        "message": text_of(hold.get("message")),
        "final": hold.get("final") is True,
        "head": text_of(hold.get("head"), 128),
        "head_report": text_of(hold.get("head_report"), 16),
        "plan_id": text_of(hold.get("plan_id"), 36),
        "retry_after": retry,
    }
