"""The agent's sampler of vLLM's live metrics: scrape vLLM's Prometheus endpoint every N seconds, turn two
scrapes into a window — gauges at the window's end, counter deltas over it, P99s from histogram bucket deltas — and
post it (``POST /v1/nodes/{name}/metrics``) for the tuning loop.

The series, as vLLM 0.33 names them (vllm/v1/metrics/loggers.py in the 0.33.0 wheel):
``vllm:num_requests_running`` (:528), ``vllm:num_requests_waiting`` (:538), ``vllm:kv_cache_usage_perc`` (:620),
``vllm:num_preemptions`` (:739, a Counter: exposed as ``vllm:num_preemptions_total``), ``vllm:generation_tokens``
(:799, exposed ``..._total``), ``vllm:time_to_first_token_seconds`` (:931) and ``vllm:e2e_request_latency_seconds``
(:961), both histograms. KV usage was ``vllm:gpu_cache_usage_perc`` before vllm-project/vllm#18354 (May 2025, the
0.9 line) introduced ``vllm:kv_cache_usage_perc`` and deprecated the old name (hidden by default from the next minor
release, removed by vllm-project/vllm#29330, Nov 2025; absent from 0.33's loggers.py): the sampler reads the new
name and falls back to the old one, so it follows whichever version the node runs. Every series carries
``model_name`` and ``engine`` labels; with several engines (data parallel) running and waiting are summed, KV usage
is the largest of the engines, counters and buckets are summed.

Reads are bounded: at most ``MAX_BYTES`` of body within ``timeout`` seconds; anything unreadable is a missed scrape
(the next one starts a new window), never an error that reaches vLLM.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ..clock import SYSTEM, Clock
from . import waiting
from .client import ResponseTooLarge, read_body

MAX_BYTES = 4 << 20  # vLLM's /metrics is tens of kB; a few MB with many LoRA adapters or engines
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
KV_USAGE, KV_USAGE_OLD = "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"
PREEMPTIONS, GEN_TOKENS = "vllm:num_preemptions", "vllm:generation_tokens"
TTFT, E2E = "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"
GAUGES = (RUNNING, WAITING, KV_USAGE, KV_USAGE_OLD)
COUNTERS = (PREEMPTIONS, GEN_TOKENS)
HISTOGRAMS = (TTFT, E2E)


class ScrapeError(ValueError):
    """The endpoint's answer cannot be used (unreachable, too large, not the exposition format)."""


@dataclass
class Scrape:
    """What one read of /metrics holds of the series the loop needs."""

    at: float
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)  # histogram -> le -> cumulative count


def parse(text: str, at: float = 0.0) -> Scrape:
    """The series of a Prometheus text exposition (prometheus-client's parser). Raises ScrapeError."""
    s = Scrape(at)
    kv: list[float] = []
    kv_old: list[float] = []
    try:
        for fam in text_string_to_metric_families(text):
            name = fam.name
            if name in GAUGES:
                vals = [x.value for x in fam.samples if x.name == name and math.isfinite(x.value)]
                if name == KV_USAGE:
                    kv += vals
                elif name == KV_USAGE_OLD:
                    kv_old += vals
                elif vals:  # a name may come in several blocks: they add up
                    s.gauges[name] = s.gauges.get(name, 0.0) + sum(vals)
            elif name in COUNTERS or (name.endswith("_total") and name[:-6] in COUNTERS):
                # a counter with its TYPE line (family "x", samples "x_total"), or without one / OpenMetrics-style
                # (the parser files the "x_total" samples under an untyped family of that name)
                base = name if name in COUNTERS else name[:-6]
                vals = [x.value for x in fam.samples if x.name == base + "_total" and math.isfinite(x.value)]
                if vals:
                    s.counters[base] = s.counters.get(base, 0.0) + sum(vals)
            elif name in HISTOGRAMS:
                b = s.buckets.setdefault(name, {})
                for x in fam.samples:
                    if x.name == name + "_bucket" and "le" in x.labels and math.isfinite(x.value):
                        try:
                            le = float(x.labels["le"])
                        except ValueError:
                            continue
                        if le != le or le < 0:  # a NaN or negative bound says nothing about latency
                            continue
                        b[le] = b.get(le, 0.0) + x.value
                if not b:
                    del s.buckets[name]
    except Exception as exc:  # the parser raises ValueError, IndexError, ... on text that is not the format
        raise ScrapeError(f"not a Prometheus text exposition ({exc.__class__.__name__}: {str(exc)[:120]})") from None
    if kv or kv_old:
        s.gauges[KV_USAGE] = max(kv or kv_old)
    return s


def quantile(q: float, before: dict[float, float] | None, after: dict[float, float] | None) -> float | None:
    """The q-quantile of the observations between two reads of a histogram's cumulative buckets, interpolated
    linearly within the bucket as Prometheus' ``histogram_quantile`` does (the +Inf bucket answers its lower
    bound). None when nothing was observed in between; a counter reset (fewer than before) counts from zero."""
    if not after:
        return None
    before = before or {}
    reset = any(after.get(le, 0.0) < c for le, c in before.items())
    les = sorted(after)
    counts = [after[le] - (0.0 if reset else before.get(le, 0.0)) for le in les]
    total = counts[-1] if les[-1] == math.inf else max(counts)
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in zip(les, counts):
        if c >= rank:
            if le == math.inf:
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


MAX_P99_S = 1e6  # the largest P99 a window may carry (service/api/schemas.py MetricsWindowIn)


def window(plan: str, prev: Scrape, cur: Scrape) -> dict | None:
    """The window between two scrapes as ``POST /v1/nodes/{name}/metrics`` takes it; None when the scrapes lack a
    gauge the loop needs, the preemption counter (its absence must not read as zero preemptions), or the interval
    is under a second."""
    span = cur.at - prev.at
    if span < 1 or any(g not in cur.gauges for g in (RUNNING, WAITING, KV_USAGE)):
        return None
    if PREEMPTIONS not in cur.counters:  # no preemption count is not zero preemptions: the loop would fail open
        return None

    def delta(name: str) -> float:
        a, b = prev.counters.get(name, 0.0), cur.counters.get(name, 0.0)
        return b if b < a else b - a  # a restart resets a counter: count from zero

    def p99(name: str) -> float | None:
        v = quantile(0.99, prev.buckets.get(name), cur.buckets.get(name))
        # beyond what a window may carry (the service takes ≤ 10^6 s): unknown, not a window lost to a 422
        return round(v, 6) if v is not None and 0 <= v <= MAX_P99_S else None

    return {
        "plan": plan,
        "window_s": round(min(span, 3600.0), 3),
        "num_requests_running": max(0.0, cur.gauges[RUNNING]),
        "num_requests_waiting": max(0.0, cur.gauges[WAITING]),
        "kv_cache_usage_perc": min(1.0, max(0.0, cur.gauges[KV_USAGE])),
        "num_preemptions": max(0.0, delta(PREEMPTIONS)),
        "ttft_p99_s": p99(TTFT),
        "e2e_p99_s": p99(E2E),
        "generation_tokens_per_s": round(max(0.0, delta(GEN_TOKENS)) / span, 3),
    }


def read(url: str, *, timeout: float = 5.0, transport: httpx.BaseTransport | None = None) -> str:
    """GET ``url``: at most MAX_BYTES of body within ``timeout`` seconds in all, no content decoding. Raises
    ScrapeError."""
    start = time.monotonic()
    try:
        with (
            httpx.Client(timeout=timeout, transport=transport) as c,
            c.stream("GET", url, headers={"Accept-Encoding": "identity", "Accept": "text/plain"}) as r,
        ):
            if r.status_code != 200:
                raise ScrapeError(f"{url}: HTTP {r.status_code}")
            body = read_body(r, url, max_bytes=MAX_BYTES, start=start, deadline=timeout)
    except ResponseTooLarge:
        raise ScrapeError(f"{url}: more than {MAX_BYTES} bytes") from None
    except httpx.ReadTimeout as exc:
        if "no complete answer" in str(exc):  # read_body's deadline, not httpx's own read timeout
            raise ScrapeError(f"{url}: no complete answer within {timeout:g} s") from None
        raise ScrapeError(f"{url}: {exc.__class__.__name__}") from None
    except httpx.HTTPError as exc:
        raise ScrapeError(f"{url}: {exc.__class__.__name__}") from None
    return body.decode("utf-8", errors="replace")


def metrics_url(argv: list[str]) -> str:
    """Where the vLLM of ``argv`` serves /metrics: its ``--port`` (vLLM's default 8000) on the loopback address
    (``--host`` set to a specific address is used as given)."""
    host, port = "127.0.0.1", "8000"
    for i, a in enumerate(argv):
        for flag in ("--port", "--host"):
            val = (
                a.split("=", 1)[1]
                if a.startswith(flag + "=")
                else argv[i + 1]
                if a == flag and i + 1 < len(argv)
                else None
            )
            if val is not None:
                if flag == "--port":
                    port = val
                elif val not in ("0.0.0.0", "::", ""):
                    host = val
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/metrics"


class Sampler:
    """Scrape every ``seconds`` of ``clock``'s time on a thread and hand each window to ``post`` (best effort: a
    failed scrape or post is skipped, the next scrape starts a new window)."""

    def __init__(
        self,
        url: str,
        plan: str,
        post: Callable[[dict], object],
        *,
        seconds: float = 15.0,
        timeout: float = 5.0,
        fetch: Callable[[str], str] | None = None,
        clock: Clock = SYSTEM,
    ):
        self.url, self.plan, self.post, self.seconds = url, plan, post, max(1.0, seconds)
        self.fetch = fetch or (lambda u: read(u, timeout=timeout))
        self.clock = clock
        self.prev: Scrape | None = None
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.posted = 0

    def sample_once(self) -> dict | None:
        """One scrape; the window since the previous one (posted), or None."""
        try:
            cur = parse(self.fetch(self.url), self.clock.monotonic())
        except ScrapeError:
            self.prev = None
            return None
        prev, self.prev = self.prev, cur
        w = window(self.plan, prev, cur) if prev is not None else None
        if w is not None:
            try:
                self.post(w)
                self.posted += 1
            except Exception:  # noqa: BLE001 — the service being away never stops the sampler
                pass
        return w

    def _loop(self) -> None:
        while not waiting.wait(self.stop_event, self.clock, self.seconds):
            self.sample_once()

    def start(self) -> Sampler:
        self.thread = threading.Thread(target=self._loop, name="preflight-metrics", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(15)
