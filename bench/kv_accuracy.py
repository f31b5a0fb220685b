"""KV-cache accuracy on tests/cases/kv: predicted ``budget.kv_cache_tokens`` vs what vLLM printed at start-up.

    python -m bench.kv_accuracy            # as the cases request (vllm_version null = 0.33.0)
    python -m bench.kv_accuracy --printing # cases without vllm_version evaluated at the version that printed the
                                           # figure (notes.vllm_version_approx) — for reading, not for asserting

Prints the per-case error table, the median absolute error and the fractions within ±5 % / ±10 %.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass

from service.domain.context import build_context
from service.domain.memory import compute_budget
from service.domain.request import LaunchRequest
from tests.support import case_files, case_request, load_case


@dataclass(frozen=True)
class CaseResult:
    id: str
    version: str
    predicted: int
    printed: int
    tolerance: float

    @property
    def error(self) -> float:
        return self.predicted / self.printed - 1

    @property
    def within_tolerance(self) -> bool:
        return abs(self.error) <= self.tolerance


def evaluate(printing_version: bool = False) -> list[CaseResult]:
    out = []
    for path in case_files("kv"):
        case = load_case(path)
        kv = case["expect"]["kv"]
        ctx = build_context(LaunchRequest.model_validate(case_request(case)))
        acct = None
        if printing_version and not case.get("vllm_version"):
            approx = (case.get("notes") or {}).get("vllm_version_approx")
            acct = approx.lstrip("~").split()[0] if approx else None
        b = compute_budget(ctx, accounting_version=acct)
        out.append(CaseResult(case["id"], acct or ctx.version, b.kv_cache_tokens, kv["kv_cache_tokens"],
                              kv.get("tolerance") or 0.10))
    return out


def summary(results: list[CaseResult]) -> dict[str, float]:
    errs = [abs(r.error) for r in results]
    return {
        "cases": len(results),
        "median_abs_error": statistics.median(errs),
        "within_5": sum(e <= 0.05 for e in errs) / len(errs),
        "within_10": sum(e <= 0.10 for e in errs) / len(errs),
        "within_tolerance": sum(r.within_tolerance for r in results) / len(results),
    }


def table(results: list[CaseResult]) -> str:
    lines = [f"| case | accounting version | predicted | printed | error |", "|---|---|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r.id} | {r.version} | {r.predicted:,} | {r.printed:,} | {r.error * 100:+.1f} % |")
    s = summary(results)
    lines.append("")
    lines.append(f"median |error| {s['median_abs_error'] * 100:.1f} %; within ±5 %: {s['within_5']:.0%}; "
                 f"within ±10 %: {s['within_10']:.0%} ({s['cases']} cases)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    print(table(evaluate(printing_version="--printing" in argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
