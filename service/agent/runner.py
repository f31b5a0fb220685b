"""Run the verified argv as a child process, echo its output, and read vLLM's start-up figures from it.

The agent stays the parent (systemd supervises it): it reports ``started`` when the child is spawned, ``running``
once vLLM logs that the server is up — with the KV cache figures it printed, for the calibration loop — and
``failed`` with the last lines of output when the child exits non-zero. SIGTERM/SIGINT are forwarded.
"""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import sys
from typing import Callable

# vLLM 0.33 log lines (kv_cache_utils.py:1147-1154; gpu_worker.py:772-813)
KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens(?:, Maximum concurrency for ([\d,]+) tokens per "
                       r"request: ([\d.]+)x)?")
KV_MEMORY = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
READY = ("Application startup complete", "Starting vLLM API server")


def parse_line(line: str, figures: dict) -> None:
    """Update ``figures`` from one log line."""
    m = KV_TOKENS.search(line)
    if m:
        figures["kv_cache_tokens"] = int(m.group(1).replace(",", ""))
        if m.group(2):
            figures["max_model_len"] = int(m.group(2).replace(",", ""))
            figures["max_concurrency"] = float(m.group(3))
    m = KV_MEMORY.search(line)
    if m:
        figures["available_kv_cache_gib"] = float(m.group(1))


def run(argv: list[str], env: dict[str, str], report: Callable[[str, str | None, dict | None], None]) -> int:
    """Run to completion; returns the child's exit status (127 when it could not start)."""
    try:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1)
    except OSError as exc:
        report("failed", f"could not start {argv[0]}: {exc}", None)
        return 127
    report("started", f"pid {proc.pid}", None)

    def forward(signum, _frame):
        proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    figures: dict = {}
    tail: collections.deque[str] = collections.deque(maxlen=20)
    announced = False
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        tail.append(line.rstrip("\n"))
        parse_line(line, figures)
        if not announced and any(marker in line for marker in READY):
            report("running", "vLLM is serving", {"vllm": dict(figures)})
            announced = True
    code = proc.wait()
    if code != 0:
        report("failed", f"vLLM exited with status {code}", {"vllm": dict(figures), "tail": list(tail)})
    return code
