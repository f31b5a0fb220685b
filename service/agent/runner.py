"""Run the verified argv as a child process, echo its output, and report its whole life.

The agent stays the parent (systemd supervises the agent, and restarts it — and so vLLM — after a crash; see
deploy/preflight-agent.service). Reports, each carrying the run's id: ``started`` when the child is spawned,
``running`` once vLLM logs that the server is up — with the KV cache figures it printed and its
``--kv-cache-memory-bytes`` suggestion, for the calibration loop —, ``heartbeat`` every ``heartbeat_seconds`` while
it runs, then ``stopped`` (the agent was asked to stop: SIGTERM/SIGINT, forwarded to the child) or ``exited``
(vLLM ended by itself: its status and last lines). When a heartbeat's answer says the plan is no longer the node's
current one (superseded or revoked), the child is stopped (SIGTERM), ``stopped`` is reported with reason
``superseded``, and ``run`` returns ``SUPERSEDED``: the agent then boots again, which runs the new plan.
"""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

from ..clock import SYSTEM, Clock
from . import waiting

# vLLM 0.33 log lines (kv_cache_utils.py:1147-1154; gpu_worker.py:772-813). "Maximum concurrency" is printed on the
# KV cache size line by some versions and on its own line by others: both are read.
KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
MAX_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
KV_MEMORY = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
KV_BYTES_HINT = re.compile(r"--kv-cache-memory-bytes[= ](\d+)")
# vLLM 0.33 (gpu_worker.py:1012-1066): "Replace gpu_memory_utilization config with `--kv-cache-memory=N` (X GiB) to
# fit into requested memory, or `--kv-cache-memory=M` (Y GiB) to fully utilize gpu memory." — N is the pool to pin
KV_BYTES_FIT = re.compile(r"--kv-cache-memory(?:-bytes)?=(\d+)`?\s*(?:\([^)]*\))?\s*to fit into requested memory")
READY = ("Application startup complete", "Starting vLLM API server")
TAIL_LINES = 20
SUPERSEDED = -1  # run()'s answer when the plan stopped being current: boot again

Report = Callable[[str, "str | None", "dict | None"], None]


def parse_line(line: str, figures: dict) -> None:
    """Update ``figures`` from one log line."""
    m = KV_TOKENS.search(line)
    if m:
        figures["kv_cache_tokens"] = int(m.group(1).replace(",", ""))
    m = MAX_CONCURRENCY.search(line)
    if m:
        figures["max_model_len"] = int(m.group(1).replace(",", ""))
        figures["max_concurrency"] = float(m.group(2))
    m = KV_MEMORY.search(line)
    if m:
        figures["available_kv_cache_gib"] = float(m.group(1))
    fit = KV_BYTES_FIT.search(line)
    hints = [fit.group(1)] if fit else KV_BYTES_HINT.findall(line)
    if hints:
        figures["kv_cache_memory_bytes_suggested"] = int(hints[-1])  # the value vLLM suggests setting
        figures["kv_cache_memory_bytes_line"] = line.strip()[:1000]


def exit_status(code: int) -> int:
    """The agent's exit status for a child's return code (a child killed by signal N: 128 + N, as a shell says)."""
    return 128 - code if code < 0 else code


def run(
    argv: list[str],
    env: dict[str, str],
    report: Report,
    *,
    heartbeat_seconds: float = 60.0,
    heartbeat: Callable[[], bool | None] | None = None,
    clock: Clock = SYSTEM,
) -> int:
    """Run to completion; returns the agent's exit status (0 after a requested stop, the child's status when it
    ended by itself, 127 when it could not start), or SUPERSEDED. ``heartbeat`` returns False when the service says
    the plan is no longer current (None: no answer); it is called every ``heartbeat_seconds`` of ``clock``'s time."""
    try:
        proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, errors="replace"
        )
    except OSError as exc:
        report("exited", f"could not start {argv[0]}: {exc}", {"status": 127, "tail": []})
        return 127
    report("started", f"pid {proc.pid}", {"pid": proc.pid})
    asked: list[int] = []

    def forward(signum, _frame):
        asked.append(signum)
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    done = threading.Event()
    superseded = threading.Event()

    def beat():
        while not waiting.wait(done, clock, heartbeat_seconds):
            if heartbeat is None:
                report("heartbeat", None, {"pid": proc.pid})
            elif heartbeat() is False and not done.is_set():
                superseded.set()
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
                return

    beater = threading.Thread(target=beat, name="preflight-heartbeat", daemon=True)
    beater.start()
    figures: dict = {}
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    announced = False
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            tail.append(line.rstrip("\n")[:2000])
            parse_line(line, figures)
            if not announced and any(marker in line for marker in READY):
                report("running", "vLLM is serving", {"vllm": dict(figures)})
                announced = True
        code = proc.wait()
    finally:
        done.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    details = {"status": code, "tail": list(tail), "vllm": dict(figures)}
    if superseded.is_set() and not asked:
        report(
            "stopped",
            f"stopped: the plan is no longer the node's current one (vLLM exit status {code})",
            {**details, "signal": "SIGTERM", "reason": "superseded"},
        )
        return SUPERSEDED
    if asked:
        name = signal.Signals(asked[0]).name
        report("stopped", f"stopped on {name} (vLLM exit status {code})", {**details, "signal": name})
        return 0
    report("exited", f"vLLM exited with status {code}", details)
    return exit_status(code)
