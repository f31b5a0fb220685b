"""The agent's sampler of vLLM's /metrics (service/agent/vllm_metrics.py): series names as vLLM 0.33 exposes them,
the pre-rename KV usage name, counter deltas and resets, P99 from bucket deltas, bounded reads."""

from __future__ import annotations

import httpx
import pytest

from service.agent.vllm_metrics import (
    KV_USAGE,
    MAX_BYTES,
    Sampler,
    ScrapeError,
    metrics_url,
    parse,
    quantile,
    read,
    window,
)
from service.clock import ManualClock
from service.sim.vllm_sim import SimVllm, SimWorkload

LABELS = 'engine="0",model_name="m"'


def exposition(*, running=5, waiting=2, kv=0.25, kv_name="vllm:kv_cache_usage_perc", pre=0, gen=0, e2e=None):
    """A vLLM-style text exposition (names and suffixes as prometheus-client renders vLLM 0.33's metrics)."""
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{LABELS}}} {running}",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{LABELS}}} {waiting}",
        f"# TYPE {kv_name} gauge",
        f"{kv_name}{{{LABELS}}} {kv}",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{{{LABELS}}} {pre}",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{LABELS}}} {gen}",
    ]
    if e2e is not None:
        lines.append("# TYPE vllm:e2e_request_latency_seconds histogram")
        for le, c in e2e:
            lines.append(f'vllm:e2e_request_latency_seconds_bucket{{{LABELS},le="{le}"}} {c}')
        lines.append(f"vllm:e2e_request_latency_seconds_count{{{LABELS}}} {e2e[-1][1]}")
    return "\n".join(lines) + "\n"


def test_a_window_from_two_scrapes():
    a = parse(exposition(pre=10, gen=1000, e2e=[("1.0", 0), ("5.0", 0), ("+Inf", 0)]), at=100)
    b = parse(
        exposition(running=64, waiting=30, kv=0.8, pre=13, gen=16000, e2e=[("1.0", 50), ("5.0", 100), ("+Inf", 100)]),
        at=115,
    )
    w = window("p1", a, b)
    assert w == {
        "plan": "p1",
        "window_s": 15.0,
        "num_requests_running": 64.0,
        "num_requests_waiting": 30.0,
        "kv_cache_usage_perc": 0.8,
        "num_preemptions": 3.0,
        "ttft_p99_s": None,
        "e2e_p99_s": pytest.approx(4.92),
        "generation_tokens_per_s": 1000.0,
    }


def test_p99_interpolates_within_the_bucket_like_histogram_quantile():
    # 100 observations: 90 ≤ 1 s, 10 in (1, 5]: rank 99 lies 9/10 into (1, 5] → 4.6
    assert quantile(0.99, {}, {1.0: 90, 5.0: 100, float("inf"): 100}) == pytest.approx(4.6)
    # only the window's observations count (bucket deltas)
    assert quantile(
        0.99, {1.0: 1000, 5.0: 1000, float("inf"): 1000}, {1.0: 1090, 5.0: 1100, float("inf"): 1100}
    ) == pytest.approx(4.6)
    # the +Inf bucket answers its lower bound; nothing observed → None
    assert quantile(0.99, {}, {1.0: 0, 5.0: 0, float("inf"): 10}) == 5.0
    assert quantile(0.99, {1.0: 5, float("inf"): 5}, {1.0: 5, float("inf"): 5}) is None


def test_the_old_kv_usage_name_is_read_when_the_new_one_is_absent():
    s = parse(exposition(kv=0.4, kv_name="vllm:gpu_cache_usage_perc"))
    assert s.gauges[KV_USAGE] == 0.4
    both = exposition(kv=0.4) + f"# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{{{LABELS}}} 0.9\n"
    assert parse(both).gauges[KV_USAGE] == 0.4  # the new name wins


def test_a_counter_reset_counts_from_zero():
    a = parse(exposition(pre=500, gen=90000), at=0)
    b = parse(exposition(pre=4, gen=3000), at=10)  # vLLM restarted
    w = window("p", a, b)
    assert w["num_preemptions"] == 4 and w["generation_tokens_per_s"] == 300


def test_engines_are_summed_and_kv_is_the_fullest():
    text = (
        exposition(running=3, kv=0.2)
        + "\n".join(
            [
                'vllm:num_requests_running{engine="1",model_name="m"} 4',
                'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.7',
            ]
        )
        + "\n"
    )
    s = parse(text)
    assert s.gauges["vllm:num_requests_running"] == 7 and s.gauges[KV_USAGE] == 0.7


def test_missing_gauges_or_a_short_interval_make_no_window():
    a = parse(exposition(), at=0)
    assert window("p", a, parse(exposition(), at=0.5)) is None
    assert window("p", a, parse("# TYPE x gauge\nx 1\n", at=20)) is None


def test_garbage_is_a_scrape_error():
    with pytest.raises(ScrapeError):
        parse('vllm:num_requests_running{engine="0" 1 2 3 {{{\n')


def test_reads_are_bounded():
    big = httpx.MockTransport(lambda req: httpx.Response(200, content=iter([b"#" * (MAX_BYTES + 10)])))
    with pytest.raises(ScrapeError, match="more than"):
        read("http://vllm/metrics", transport=big)
    down = httpx.MockTransport(lambda req: httpx.Response(503))
    with pytest.raises(ScrapeError, match="503"):
        read("http://vllm/metrics", transport=down)
    ok = httpx.MockTransport(lambda req: httpx.Response(200, content=iter([exposition().encode()])))
    assert "vllm:num_requests_running" in read("http://vllm/metrics", transport=ok)


def test_metrics_url_follows_the_plans_port_and_host():
    assert metrics_url(["vllm", "serve", "m", "--port", "8123"]) == "http://127.0.0.1:8123/metrics"
    assert metrics_url(["vllm", "serve", "m", "--host=10.0.0.5"]) == "http://10.0.0.5:8000/metrics"
    assert metrics_url(["vllm", "serve", "m", "--host", "0.0.0.0", "--port=9000"]) == "http://127.0.0.1:9000/metrics"


def test_sampler_posts_windows_of_the_simulator_and_skips_failed_scrapes():
    sim = SimVllm(kv_cache_tokens=100_000, max_num_seqs=64, workload=SimWorkload(400, 200, 200.0), seed=1)
    clock = ManualClock()
    posted = []
    fail = {2}
    calls = [0]

    def fetch(_url):
        calls[0] += 1
        if calls[0] in fail:
            raise ScrapeError("down")
        sim.advance(15)
        clock.advance(15)
        return sim.exposition()

    s = Sampler("http://x/metrics", "plan-1", posted.append, fetch=fetch, clock=clock)
    assert s.sample_once() is None  # the first scrape is the baseline
    assert s.sample_once() is None  # a failed scrape: no window, and the next one is a new baseline
    assert s.sample_once() is None
    w = s.sample_once()
    assert w is not None and posted == [w]
    assert w["plan"] == "plan-1" and w["window_s"] == 15 and w["num_requests_running"] == 64
    assert w["kv_cache_usage_perc"] == pytest.approx(64 * 500 / 100_000, rel=0.05)
    assert w["e2e_p99_s"] is not None and w["generation_tokens_per_s"] > 0


def test_a_missing_preemption_counter_is_no_window_not_zero_preemptions():
    """A renamed or missing counter must not read as 0 preemptions (the loop would keep raising)."""
    without = "\n".join(line for line in exposition(pre=5).splitlines() if "preemptions" not in line) + "\n"
    a, b = parse(without, at=100), parse(without, at=115)
    assert window("p1", a, b) is None
    # the counter without its TYPE line, or OpenMetrics-style (TYPE names the family without _total): still read
    untyped = (
        "\n".join(
            line for line in exposition(pre=7).splitlines() if line != "# TYPE vllm:num_preemptions_total counter"
        )
        + "\n"
    )
    assert parse(untyped).counters["vllm:num_preemptions"] == 7.0
    om = exposition(pre=9).replace("# TYPE vllm:num_preemptions_total counter", "# TYPE vllm:num_preemptions counter")
    assert parse(om).counters["vllm:num_preemptions"] == 9.0
    w = window("p1", parse(exposition(pre=1), at=100), parse(untyped, at=115))
    assert w is not None and w["num_preemptions"] == 6.0


def test_absurd_histogram_bounds_are_dropped_and_an_absurd_p99_is_unknown():
    bad = exposition(e2e=[("NaN", 5), ("-1", 5), ("1.0", 10), ("+Inf", 10)])
    assert sorted(parse(bad).buckets["vllm:e2e_request_latency_seconds"]) == [1.0, float("inf")]
    huge_a = parse(exposition(e2e=[("1e300", 0), ("+Inf", 0)]), at=100)
    huge_b = parse(exposition(e2e=[("1e300", 50), ("+Inf", 50)]), at=115)
    w = window("p1", huge_a, huge_b)
    assert w is not None and w["e2e_p99_s"] is None  # the window still goes out, without that figure
