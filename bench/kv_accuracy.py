"""KV-cache accuracy on tests/cases/kv: predicted ``budget.kv_cache_tokens`` vs what vLLM printed at start-up, and
the error of each component of the budget where the case printed it.

    python -m bench.kv_accuracy            # as the cases request (vllm_version null = 0.33.0)
    python -m bench.kv_accuracy --printing # cases without vllm_version evaluated at the version that printed the
                                           # figure (notes.vllm_version_approx) — for reading, not for asserting

Prints the per-case error table (KV tokens), the per-component table (weights, activation peak, non-torch memory,
CUDA graphs, KV pool: predicted − printed in GiB and relative, for every case that printed the component — errors
that cancel in the total hide faults in the parts), the median absolute error and the fractions within ±5 % / ±10 %.

Component mapping (what vLLM's memory line prints vs the budget): ``weights_gib`` ↔ ``weights_bytes_per_gpu``;
``activation_peak_gib`` ↔ ``activation_peak_bytes`` (text forward + sampler + the multimodal encoder's profile);
``non_torch_gib`` ↔ ``non_torch_bytes``; ``cuda_graph_gib`` ↔ the graph pool whether inside the budget (≥ 0.21) or
captured after it (``cuda_graph_outside_budget_bytes``); ``kv_cache_gib`` ↔ ``kv_cache_bytes_per_gpu``.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field

from service.domain.context import build_context
from service.domain.gpus import GIB
from service.domain.memory import Budget, compute_budget
from service.domain.request import LaunchRequest
from tests.support import case_files, case_request, load_case

# printed key in expect.kv → (label, predicted bytes from the budget)
COMPONENTS: dict[str, tuple[str, object]] = {
    "weights_gib": ("weights", lambda b: b.weights_bytes_per_gpu),
    "activation_peak_gib": ("activation peak", lambda b: b.activation_peak_bytes),
    "non_torch_gib": ("non-torch", lambda b: b.non_torch_bytes),
    "cuda_graph_gib": ("CUDA graphs", lambda b: b.cuda_graph_bytes + b.cuda_graph_outside_budget_bytes),
    "kv_cache_gib": ("KV pool", lambda b: b.kv_cache_bytes_per_gpu),
}


@dataclass(frozen=True)
class ComponentResult:
    key: str
    predicted_gib: float
    printed_gib: float

    @property
    def label(self) -> str:
        return COMPONENTS[self.key][0]

    @property
    def delta_gib(self) -> float:
        return self.predicted_gib - self.printed_gib

    @property
    def error(self) -> float | None:
        return self.predicted_gib / self.printed_gib - 1 if self.printed_gib else None


@dataclass(frozen=True)
class CaseResult:
    id: str
    version: str
    predicted: int
    printed: int
    tolerance: float
    components: tuple[ComponentResult, ...] = field(default=())

    @property
    def error(self) -> float:
        return self.predicted / self.printed - 1

    @property
    def within_tolerance(self) -> bool:
        return abs(self.error) <= self.tolerance

    def component(self, key: str) -> ComponentResult | None:
        return next((c for c in self.components if c.key == key), None)


def components_of(b: Budget, printed: dict) -> tuple[ComponentResult, ...]:
    out = []
    for key, (_, get) in COMPONENTS.items():
        if printed.get(key) is not None:
            out.append(ComponentResult(key, get(b) / GIB, float(printed[key])))
    return tuple(out)


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
        out.append(
            CaseResult(
                case["id"],
                acct or ctx.version,
                b.kv_cache_tokens,
                kv["kv_cache_tokens"],
                kv.get("tolerance") or 0.10,
                components_of(b, kv),
            )
        )
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


def component_summary(results: list[CaseResult]) -> dict[str, dict[str, float]]:
    """Per component over the cases that printed it: count, median |predicted − printed| (GiB) and median
    |relative error| (components printed as 0 count in the GiB figure only)."""
    out: dict[str, dict[str, float]] = {}
    for key, (label, _) in COMPONENTS.items():
        cs = [c for r in results if (c := r.component(key)) is not None]
        if not cs:
            continue
        rel = [abs(c.error) for c in cs if c.error is not None]
        out[label] = {
            "cases": len(cs),
            "median_abs_gib": statistics.median(abs(c.delta_gib) for c in cs),
            "median_abs_error": statistics.median(rel) if rel else 0.0,
        }
    return out


def _cell(c: ComponentResult | None) -> str:
    if c is None:
        return "—"
    rel = f" ({c.error * 100:+.0f} %)" if c.error is not None else ""
    return f"{c.predicted_gib:.2f} / {c.printed_gib:.2f}{rel}"


def table(results: list[CaseResult]) -> str:
    lines = ["| case | accounting version | predicted | printed | error |", "|---|---|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r.id} | {r.version} | {r.predicted:,} | {r.printed:,} | {r.error * 100:+.1f} % |")
    s = summary(results)
    lines.append("")
    lines.append(
        f"KV tokens: median |error| {s['median_abs_error'] * 100:.1f} %; within ±5 %: {s['within_5']:.0%}; "
        f"within ±10 %: {s['within_10']:.0%} ({s['cases']} cases)"
    )
    return "\n".join(lines)


def component_table(results: list[CaseResult]) -> str:
    labels = [label for label, _ in COMPONENTS.values()]
    lines = [
        "Per component, GiB per GPU, predicted / printed (relative error); — where vLLM printed none:",
        "",
        "| case | " + " | ".join(labels) + " |",
        "|---|" + "---:|" * len(labels),
    ]
    for r in results:
        if r.components:
            lines.append(f"| {r.id} | " + " | ".join(_cell(r.component(k)) for k in COMPONENTS) + " |")
    lines.append("")
    for label, s in component_summary(results).items():
        lines.append(
            f"- {label}: {s['cases']} cases, median |Δ| {s['median_abs_gib']:.2f} GiB, "
            f"median |error| {s['median_abs_error'] * 100:.1f} %"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    results = evaluate(printing_version="--printing" in argv)
    print(table(results))
    print()
    print(component_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
