"""A small vLLM stand-in for testing the tuning loop: it serves ``/metrics`` as vLLM 0.33 does (the same
series names, labels and histogram buckets: vllm/v1/metrics/loggers.py and buckets.py of the 0.33.0 wheel) from a
queueing model, so the agent's sampler reads it like a real vLLM.

The model (one engine, time advanced in steps of at most ``STEP_S`` seconds, seeded):

- requests arrive at ``arrival_rate`` per second (Poisson); ``in_system`` = running + waiting; running =
  min(max_num_seqs, in_system) — the scheduler admits up to ``max_num_seqs``;
- a request holds prompt + generated tokens of KV: on average ``held = prompt + output / 2`` per running sequence,
  with the batch average varying by ``held_cv / √running`` from step to step;
- the KV pool is Preflight's own budget for the plan (``kv_cache_tokens``); when running × held exceeds it, vLLM
  preempts: ``vllm:num_preemptions_total`` climbs with the overflow, and preempted work is redone (throughput drops);
- an engine step takes ``step_base_s + step_per_seq_s × running`` (latency rises with the batch); a request takes
  ``prompt / prefill_tokens_per_s + output × step`` once running; TTFT and end-to-end latency add the queueing time
  (Little's law); both are observed into vLLM's histograms for the requests that finish in the step.

``true_knee()`` is the simulator's own knee: the largest ``max_num_seqs`` whose running sequences fit the pool on
average (pool ÷ held). ``python -m service.sim.vllm_sim serve MODEL --max-num-seqs N --port P`` runs it as an HTTP
server that the agent can ``--exec`` in place of vllm (pool and workload from ``VLLM_SIM_*`` variables).
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# vLLM 0.33 buckets (vllm/v1/metrics/buckets.py:30-52 request latency, :57-80 time to first token)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
STEP_S = 1.0
MAX_QUEUE = 20_000  # clients give up beyond this


@dataclass(frozen=True)
class SimWorkload:
    """Traffic in tokens per request and requests per second."""

    prompt: float
    output: float
    arrival_rate: float
    held_cv: float = 0.15  # spread of one sequence's held KV around the mean
    latency_cv: float = 0.25  # spread of per-request latency around the model's mean

    @property
    def held(self) -> float:
        return self.prompt + self.output / 2


@dataclass
class SimEngine:
    """Engine speed: step time = base + per_seq × running; prefill throughput."""

    step_base_s: float = 0.015
    step_per_seq_s: float = 0.00005
    prefill_tokens_per_s: float = 20_000.0

    def step(self, running: float) -> float:
        return self.step_base_s + self.step_per_seq_s * running


class SimVllm:
    def __init__(
        self,
        *,
        kv_cache_tokens: int,
        max_num_seqs: int,
        workload: SimWorkload,
        seed: int = 0,
        engine: SimEngine | None = None,
        model_name: str = "sim",
    ):
        self.pool = float(kv_cache_tokens)
        self.max_num_seqs = int(max_num_seqs)
        self.workload = workload
        self.engine = engine or SimEngine()
        self.rng = random.Random(seed)
        self.in_system = 0.0
        self.burst_factor = 1.0  # > 1: sequences longer than the workload's (a burst of long requests)
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        lv = (model_name, "0")
        r = self.registry
        self.g_running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", labels, registry=r
        ).labels(*lv)
        self.g_waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels, registry=r
        ).labels(*lv)
        self.g_kv = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, registry=r
        ).labels(*lv)
        self.c_pre = Counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", labels, registry=r
        ).labels(*lv)
        self.c_gen = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=r
        ).labels(*lv)
        self.h_ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=r,
        ).labels(*lv)
        self.h_e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            labels,
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        ).labels(*lv)
        self._carry = 0.0  # fractional completions carried between steps

    # -- the model ---------------------------------------------------------------------------------------------
    def true_knee(self) -> int:
        """The largest max_num_seqs whose running sequences fit the KV pool on average."""
        return int(self.pool // self.workload.held)

    def capacity(self, running: float) -> float:
        """Requests per second finished with ``running`` sequences in the batch (no preemption)."""
        w = self.workload
        service = w.prompt / self.engine.prefill_tokens_per_s + w.output * self.engine.step(running)
        return running / service if service > 0 else 0.0

    def configure(self, *, max_num_seqs: int, kv_cache_tokens: int) -> None:
        """A new plan: vLLM restarts with it (the queue of clients stays)."""
        self.max_num_seqs, self.pool = int(max_num_seqs), float(kv_cache_tokens)
        self.in_system = min(self.in_system, MAX_QUEUE)

    def _poisson(self, lam: float) -> int:
        if lam <= 0:
            return 0
        if lam > 50:
            return max(0, round(self.rng.gauss(lam, math.sqrt(lam))))
        k, p, limit = 0, 1.0, math.exp(-lam)
        while True:
            p *= self.rng.random()
            if p <= limit:
                return k
            k += 1

    def _step(self, dt: float) -> None:
        w, e = self.workload, self.engine
        self.in_system = min(MAX_QUEUE, self.in_system + self._poisson(w.arrival_rate * dt))
        running = min(float(self.max_num_seqs), self.in_system)
        waiting = self.in_system - running
        held = w.held * self.burst_factor
        if running > 0:
            held *= max(0.5, 1 + self.rng.gauss(0, w.held_cv / math.sqrt(running)))
        need = running * held
        preempted = 0
        useful = running
        if need > self.pool and running > 0:
            overflow_seqs = (need - self.pool) / held
            # each step the scheduler cannot grow the batch's KV evicts sequences to make room (recompute later)
            preempted = self._poisson((overflow_seqs + 0.5) * dt / (e.step(running) * 20))
            useful = max(1.0, running - overflow_seqs * 2)  # recomputation wastes the evicted sequences' work
        done_rate = self.capacity(running) * (useful / running if running else 0)
        expected = done_rate * dt + self._carry
        done = min(int(expected), int(self.in_system))
        self._carry = expected - int(expected)
        self.in_system -= done
        queue_wait = waiting / done_rate if done_rate > 0 else 0.0
        ttft_mean = queue_wait + w.prompt / e.prefill_tokens_per_s + e.step(running)
        e2e_mean = (
            queue_wait
            + w.prompt / e.prefill_tokens_per_s
            + w.output * e.step(running) * (running / useful if useful else 1)
        )
        for _ in range(min(done, 2000)):
            spread = math.exp(self.rng.gauss(0, w.latency_cv))
            self.h_ttft.observe(ttft_mean * spread)
            self.h_e2e.observe(e2e_mean * spread)
        if preempted:
            self.c_pre.inc(preempted)
        if done:
            self.c_gen.inc(done * w.output)
        self.g_running.set(running)
        self.g_waiting.set(waiting)
        self.g_kv.set(min(1.0, need / self.pool) if self.pool > 0 else 1.0)

    def advance(self, seconds: float) -> None:
        while seconds > 1e-9:
            dt = min(STEP_S, seconds)
            self._step(dt)
            seconds -= dt

    def exposition(self) -> str:
        return generate_latest(self.registry).decode()


# -- as a process the agent runs instead of vllm ------------------------------------------------------------------
def _arg(argv: list[str], flag: str, default: str) -> str:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return default


def main(argv: list[str] | None = None) -> int:
    """``vllm_sim serve MODEL [vllm flags]``: serve /metrics on ``--port`` (default 8000). The pool comes from
    ``VLLM_SIM_KV_TOKENS``, the workload from ``VLLM_SIM_WORKLOAD`` (JSON of SimWorkload's fields), the model's
    time runs ``VLLM_SIM_SPEED`` times faster than the clock (default 1)."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    argv = list(sys.argv[1:] if argv is None else argv)
    port = int(_arg(argv, "--port", "8000"))
    mns = int(_arg(argv, "--max-num-seqs", "256"))
    sim = SimVllm(
        kv_cache_tokens=int(os.environ.get("VLLM_SIM_KV_TOKENS", "100000")),
        max_num_seqs=mns,
        workload=SimWorkload(
            **json.loads(os.environ.get("VLLM_SIM_WORKLOAD", '{"prompt": 400, "output": 200, "arrival_rate": 50}'))
        ),
        seed=int(os.environ.get("VLLM_SIM_SEED", "0")),
    )
    speed = float(os.environ.get("VLLM_SIM_SPEED", "1"))
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path != "/metrics":
                self.send_error(404)
                return
            with lock:
                body = sim.exposition().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"GPU KV cache size: {int(sim.pool):,} tokens", flush=True)
    print("INFO:     Application startup complete.", flush=True)
    last = time.monotonic()
    try:
        while True:
            time.sleep(0.2)
            now = time.monotonic()
            with lock:
                sim.advance((now - last) * speed)
            last = now
    except KeyboardInterrupt:
        return 0
    finally:
        server.shutdown()


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sys.exit(main())
