"""The agent's supervision of vLLM, in process: reporting never stalls vLLM's output, and the lifecycle reports."""

from __future__ import annotations

import sys
import textwrap
import time
import types

from service.agent import runner
from service.agent.client import AgentState
from service.agent.reports import Reporter

CHATTY = textwrap.dedent("""\
    import sys, time
    for i in range(4000):
        print("x" * 100, flush=False)
    sys.stdout.flush()
    open(sys.argv[1], "w").write(repr(time.time()))
    print("INFO:     Application startup complete.", flush=True)
""")


class SlowService:
    """A service that takes ``delay`` seconds to answer each report (a congested network)."""

    def __init__(self, delay):
        self.delay, self.sent = delay, []

    def post_report(self, body):
        time.sleep(self.delay)
        self.sent.append(body)
        return types.SimpleNamespace(status_code=201, json=lambda: {"current": True})


def test_a_slow_service_never_stalls_vllms_output(tmp_path, capsys):
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    done = tmp_path / "done"
    service = SlowService(2.0)
    report = Reporter(service, AgentState(path=tmp_path / "state.json"), plan_id="p-1", seq=3)
    start = time.time()
    code = runner.run([sys.executable, str(script), str(done)], {}, report.enqueue, heartbeat=report.heartbeat)
    wrote_all = float(done.read_text()) - start
    report.close()
    assert code == 0
    # 400 kB of output (six times a pipe's buffer) written while the first report was still in flight
    assert wrote_all < 1.5, wrote_all
    assert [b["status"] for b in service.sent] == ["started", "running", "exited"]
    assert {b["details"]["run_id"] for b in service.sent} == {report.run_id}
    assert all(b["details"]["seq"] == 3 and b["plan_id"] == "p-1" for b in service.sent)
    assert not (tmp_path / "state.json").exists()  # everything delivered: nothing kept


def test_undelivered_reports_are_kept_for_the_next_boot(tmp_path):
    class Away:
        def post_report(self, body):
            import httpx

            raise httpx.ConnectError("unreachable")

    state = AgentState(path=tmp_path / "state.json")
    report = Reporter(Away(), state, plan_id="p-1", seq=3, offline={"age_seconds": 10})
    code = runner.run([sys.executable, "-c", "raise SystemExit(4)"], {}, report.enqueue)
    report.close()
    assert code == 4
    kept = AgentState.load(tmp_path / "state.json").pending
    assert [(b["status"], b["details"].get("status")) for b in kept] == [("started", None), ("exited", 4)]
    assert kept[0]["details"]["offline_boot"] == {"age_seconds": 10}
