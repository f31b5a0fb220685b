"""In-process cost of one plan: parse the launch request, validate (rules + memory budget + render), sign.

    python -m bench.inprocess [--n 5000]

Real input: tests/fixtures/models/meta-llama__Meta-Llama-3.1-70B/config.json on 8 × H100 SXM, TP 8, max_model_len 8192,
gpu_memory_utilization 0.9 — the request POST /v1/plans builds (service/services/plans.py:launch_request). Times
per call in µs (time.perf_counter_ns, GC on, after a warm-up). Stages:

- parse:    LaunchRequest.model_validate(dict)                      (pydantic)
- validate: service.domain.validate.validate(request)               (context, rules, budget, render, shell command)
- render:   render_argv + shell_command on the built context        (part of validate, timed alone for reference)
- sign:     plan_claims + KeyStore.sign, then the freshness statement signed with it (freshness_claims + sign):
            two Ed25519 compact JWS (joserfc), as POST /v1/plans signs per node
- total:    parse + validate + sign, as one plan for one node costs
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tempfile
import time

from service.domain.render import render_argv, shell_command
from service.domain.request import LaunchRequest
from service.domain.validate import validate
from service.signing import FRESHNESS_MEDIA_TYPE, KeyStore, freshness_claims, plan_claims, plan_digest

from .common import ENGINE_ARGS, FIXTURE, ROOT, machine, pct, table

URI = "s3://weights/meta-llama/Llama-3.1-70B"


def request_dict() -> dict:
    config = json.loads((ROOT / "tests" / "fixtures" / "models" / FIXTURE / "config.json").read_text())
    return {
        "model": {"name": "meta-llama/Llama-3.1-70B", "uri": URI, "config": config},
        "hardware": {"gpu": "h100-sxm-80gb", "count": 8, "nodes": 1, "interconnect": "nvlink"},
        "environment": "production",
        "engine_args": dict(ENGINE_ARGS),
        "env": {},
    }


def timeit(fn, n: int, warmup: int = 200) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        fn()
        out.append((clock() - t0) / 1000)
    out.sort()
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000, help="timed iterations per stage")
    args = ap.parse_args(argv)

    raw = request_dict()
    with tempfile.TemporaryDirectory(prefix="preflight-bench-keys-") as tmp:
        keys = KeyStore(pathlib.Path(tmp) / "keys", create=True)
        return _run(args, raw, keys)


def _run(args, raw: dict, keys: KeyStore) -> dict:
    request = LaunchRequest.model_validate(raw)
    result = validate(request, model_ref=URI)
    assert result.verdict in ("accept", "warn"), result.as_dict()
    ctx = result.context

    def parse():
        return LaunchRequest.model_validate(raw)

    def val():
        return validate(request, model_ref=URI)

    def render():
        return shell_command(render_argv(ctx, URI), {})

    def sign(res=result):
        claims = plan_claims(
            issuer="preflight",
            audience="preflight-agent",
            node="gpu-00001",
            plan_id="00000000-0000-0000-0000-000000000000",
            seq=1,
            manifest_digest="sha256:" + "0" * 64,
            vllm_version=res.vllm_version,
            argv=res.argv,
            env={},
            model_uri=URI,
        )
        signed = keys.sign(claims)
        keys.sign(
            freshness_claims(
                issuer="preflight",
                audience="preflight-agent",
                node="gpu-00001",
                plan_id="00000000-0000-0000-0000-000000000000",
                seq=1,
                digest=plan_digest(signed),
                ttl=3600,
                acked_seq=0,
            ),
            typ=FRESHNESS_MEDIA_TYPE,
            refresh=False,
        )
        return signed

    def total():
        res = validate(LaunchRequest.model_validate(raw), model_ref=URI)
        return sign(res)

    rows, figures = [], {}
    for name, fn in [
        ("parse (LaunchRequest)", parse),
        ("validate (rules+budget+render)", val),
        ("  of which render", render),
        ("sign (plan + freshness JWS)", sign),
        ("total parse+validate+sign", total),
    ]:
        t = timeit(fn, args.n)
        figures[name] = {"p50": pct(t, 50), "p99": pct(t, 99), "mean": statistics.fmean(t)}
        rows.append([name, args.n, pct(t, 50), pct(t, 99), statistics.fmean(t)])
    print(f"in-process plan cost — {machine()}")
    print(f"input: {FIXTURE} on 8×H100 SXM, {ENGINE_ARGS}; verdict {result.verdict}, JWS {len(sign())} bytes")
    print(table(["stage", "n", "p50 µs", "p99 µs", "mean µs"], rows))
    p50 = figures["total parse+validate+sign"]["p50"]
    print(f"floor ≤ 500 µs p50: {'met' if p50 <= 500 else 'MISSED'}; aim ≤ 200 µs: {'met' if p50 <= 200 else 'missed'}")
    return figures


if __name__ == "__main__":
    main()
