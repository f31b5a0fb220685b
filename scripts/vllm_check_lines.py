"""Which vLLM release lines make each start-up check Preflight mirrors, read from each release's own source.

    python scripts/vllm_check_lines.py            # every supported line (service/data/vllm/<version>.json)
    python scripts/vllm_check_lines.py --check    # compare with the checked-in service/data/vllm/checks/check_lines.json

For each supported line: the wheel its catalogue was generated from (``pip download vllm==X --no-deps``, checked by
the SHA-256 the catalogue records), unpacked to its ``vllm/**.py`` only. Every string literal of every module is
read with ``ast`` (implicitly joined literals are one node there; ``+`` of literals and f-strings are joined too, an
f-string's field written ``{expr}``) and its whitespace collapsed, so a message split over lines or f-string pieces
reads as one text. For each check in CHECKS (a Preflight rule id → a distinctive fragment of vLLM's error message)
the output records the lines whose source holds the fragment, with each place (file:first-last line) and the whole
message there. A line where the message exists but vLLM cannot reach the check at start-up (another engine's path,
a fallback instead of a refusal) is listed under ``off`` with the reason, read by hand from the code around it.

The rules gate on this data (service/domain/rules/gating.py ``vllm_checks``) instead of a hand-written release.
"""

from __future__ import annotations

import argparse
import ast
import json
import pathlib
import re
import sys
from dataclasses import dataclass, field

from gen_vllm_catalogue import DATA, release_source, sha256, wheel_for

OUT = DATA / "checks" / "check_lines.json"
GENERATOR = "scripts/vllm_check_lines.py"


@dataclass(frozen=True)
class Check:
    rule: str  # the Preflight rule id (a code a registered rule emits)
    fragments: tuple[str, ...]  # any of them marks the check (vLLM reworded some messages between lines)
    off: dict[str, str] = field(default_factory=dict)  # release -> why the check is present but not reached


# check id -> what marks it in vLLM's source. A fragment avoids f-string fields where the wording around them varies.
CHECKS: dict[str, Check] = {
    "nsight_requires_ray": Check(
        "nsight_requires_ray", ("Unable to use nsight profiling unless workers run with Ray",)
    ),
    # not a refusal: up to 0.10 a world size beyond the node's GPUs makes Ray the default backend (so nsight works)
    "ray_default_beyond_node": Check("nsight_requires_ray", ("required for multi-node inference",)),
    "dp_hybrid_needs_local": Check(
        "dp_lb_mode",
        (
            "data_parallel_size_local must be set to use data_parallel_hybrid_lb",
            "`--data-parallel-hybrid-lb` requires `--data-parallel-size-local`",
        ),
    ),
    "dp_lb_modes_exclusive": Check(
        "dp_lb_mode",
        (
            "data_parallel_hybrid_lb and data_parallel_external_lb cannot both be True",
            "`--data-parallel-hybrid-lb` and `--data-parallel-external-lb` cannot be enabled together",
        ),
    ),
    "dp_external_needs_rank": Check(
        "dp_external_rank",
        (
            "must be spefified if data_parallel_external_lb is enable",
            "must be specified if data_parallel_external_lb",
            "`--data-parallel-external-lb` requires a data-parallel rank",
        ),
    ),
    "dp_external_local_one": Check(
        "dp_external_rank",
        (
            "data_parallel_size_local must be 1",
            "an external data-parallel rank requires `--data-parallel-size-local 1`",
        ),
    ),
    "dp_external_needs_dp": Check(
        "dp_external_rank", ("data_parallel_external_lb can only be set when data_parallel_size > 1",)
    ),
    "dp_local_at_most_dp": Check("dp_size_local", ("must be <= data_parallel_size",)),
    "dp_rank_range": Check("dp_rank_range", ("data_parallel_rank ({self.data_parallel_rank}) must be in the range",)),
    "eplb_redundant_needs_eplb": Check(
        "eplb_options", ("but EPLB is not enabled. Either enable EPLB or unset num_redundant_experts",)
    ),
    "eplb_needs_parallelism": Check(
        "eplb_options",
        (
            "EPLB requires tensor_parallel_size or data_parallel_size to be greater than 1",
            "EPLB requires tensor, prefill-context, or data parallelism",
        ),
    ),
    "elastic_ep_needs_eplb": Check("eplb_options", ("Elastic EP is only supported with enable_eplb=True",)),
    "spec_tokens_without_model": Check(
        "spec_model_missing", ("num_speculative_tokens was provided but without speculative model",)
    ),
    # up to 0.10 the draft is taken from the target for some model types, else refused whatever the method
    "spec_tokens_without_model_by_type": Check(
        "spec_model_missing", ("num_speculative_tokens was provided without speculative model",)
    ),
    "structured_output_whitespace": Check(
        "structured_output_options", ("disable_any_whitespace is only supported for xgrammar and guidance backends",)
    ),
    "structured_output_additional_properties": Check(
        "structured_output_options", ("disable_additional_properties is only supported for the guidance backend",)
    ),
    "long_partial_prefills_bounds": Check(
        "partial_prefill_bounds",
        (
            "must be greater than or equal to 1 and less than or equal to max_num_partial_prefills",
            "must be less than or equal to self.max_num_partial_prefills=",
        ),
    ),
    "batched_tokens_at_least_max_num_seqs": Check(
        "batched_tokens_lt_max_num_seqs", ("must be greater than or equal to max_num_seqs",)
    ),
    "mamba_block_needs_prefix_caching": Check(
        "mamba_options", ("--mamba-block-size can only be set with --enable-prefix-caching",)
    ),
    "mamba_stochastic_rounding_float16": Check(
        "mamba_options", ("Stochastic rounding for Mamba cache requires the SSM cache to be float16",)
    ),
    "mamba_ssu_needs_flashinfer": Check(
        "mamba_ssu_algorithm", ("Mamba SSU algorithm selection is only supported with the FlashInfer backend",)
    ),
    "sampling_replay_logprobs": Check(
        "sampling_replay_logprobs", ("sampling distribution replay requires logprobs_mode='processed_logprobs'",)
    ),
    "batch_sharded_sampling": Check(
        "batch_sharded_sampling", ("Batch-sharded sampling was explicitly enabled via the",)
    ),
    "mamba_align_needs_chunked_prefill": Check(
        "mamba_prefix_caching_chunked_prefill", ("Chunked prefill is required for mamba cache mode",)
    ),
    "dcp_a2a_needs_dcp": Check("dcp_comm_backend", ("requires decode_context_parallel_size > 1",)),
    "cudagraph_max_size_positive": Check(
        "cudagraph_capture_size", ("Maximum cudagraph size should be greater than or equal to 1",)
    ),
    # not a refusal: where the source holds this, "auto" selects the backend; elsewhere it is an unknown name
    "attention_backend_auto_selects": Check("backend_unknown", ('The special value "auto" is treated as None',)),
    "kv_offloading_needs_size": Check(
        "kv_offloading_options", ("You must set kv_offloading_size when kv_offloading_backend is set",)
    ),
    "grpc_port_needs_rust_frontend": Check(
        "serve_option_pair", ("--grpc-port requires VLLM_USE_RUST_FRONTEND=1 vllm serve",)
    ),
    "hc_sp_model_support": Check("hc_sp_options", ("--enable-hc-sp is not supported for this model",)),
    "kda_fused_rocm_only": Check("kda_prefill_backend", ("--kda-prefill-backend=fused is only available on ROCm",)),
    "mm_shm_object_size_needs_shm": Check(
        "mm_cache_options", ("'mm_shm_cache_max_object_size_mb' should only be set when",)
    ),
}


def _spaces(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _text(node: ast.AST) -> str | None:
    """The literal text of a string node (an f-string's fields as ``{expr}``), None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                parts.append(value.value)
            elif isinstance(value, ast.FormattedValue):
                parts.append("{" + ast.unparse(value.value) + "}")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return None if left is None or right is None else left + right
    return None


def literals(root: pathlib.Path) -> list[tuple[str, int, int, str]]:
    """(file, first line, last line, text) of every outermost string literal under ``root/vllm``, placed at the
    innermost statement that holds it (the ``raise``, ``assert`` or assignment of a message)."""
    out = []
    for path in sorted((root / "vllm").rglob("*.py")):
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except SyntaxError as exc:
            raise SystemExit(f"{path}: {exc}") from exc  # a module not read could hide a check: fail closed
        rel = path.relative_to(root).as_posix()
        _visit(tree, (), rel, out)
    return out


def _visit(node: ast.AST, stmts: tuple[ast.AST, ...], rel: str, out: list[tuple[str, int, int, str]]) -> None:
    """``stmts``: the statements that hold ``node``, outermost first."""
    for child in ast.iter_child_nodes(node):
        text = _text(child)
        if text is None:
            _visit(child, (*stmts, child) if isinstance(child, ast.stmt) else stmts, rel, out)
            continue
        holder = stmts[-1] if stmts else child
        first, last = getattr(holder, "lineno", 1), getattr(holder, "end_lineno", None) or 1
        parent = stmts[-2] if len(stmts) > 1 else None
        if isinstance(parent, ast.If) and parent.body == [holder]:
            first = parent.lineno  # ``if cond: raise …``: the place shows the condition too
        out.append((rel, first, max(first, last), _spaces(text)))


def places(found: list[tuple[str, int, int, str]], check: Check) -> list[dict[str, str]]:
    hits = []
    for rel, first, last, text in found:
        if any(_spaces(f) in text for f in check.fragments):
            at = f"{rel}:{first}" if first == last else f"{rel}:{first}-{last}"
            hits.append({"at": at, "text": text})
    return hits


def supported() -> list[str]:
    versions = [p.stem for p in DATA.glob("*.json") if re.fullmatch(r"\d+\.\d+\.\d+", p.stem)]
    return sorted(versions, key=lambda v: tuple(int(x) for x in v.split(".")))


def generate(work: pathlib.Path) -> dict:
    wheels: dict[str, dict[str, str]] = {}
    per_line: dict[str, list[tuple[str, int, int, str]]] = {}
    for version in supported():
        recorded = json.loads((DATA / f"{version}.json").read_text())["source"]
        wheel = wheel_for(version, work)
        digest = sha256(wheel)
        if digest != recorded["sha256"]:
            raise SystemExit(f"{wheel.name}: SHA-256 differs from the one {version}.json was generated from")
        wheels[version] = {"wheel": wheel.name, "sha256": digest}
        per_line[version] = literals(release_source(version, wheel, work))
        print(f"{version}: {len(per_line[version])} literals", file=sys.stderr)
    checks = {}
    for name, check in CHECKS.items():
        found = {v: hits for v in per_line if (hits := places(per_line[v], check))}
        unknown = set(check.off) - set(found)
        if unknown:
            raise SystemExit(f"{name}: off for {sorted(unknown)}, where the source has no such check")
        checks[name] = {
            "rule": check.rule,
            "fragments": list(check.fragments),
            "lines": [v for v in found if v not in check.off],
            "off": dict(sorted(check.off.items(), key=lambda kv: supported().index(kv[0]))),
            "found": found,
        }
        if not found:
            raise SystemExit(f"{name}: no release has {check.fragments}")
    return {"generator": GENERATOR, "wheels": wheels, "checks": checks}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/preflight-vllm-gen"))
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="compare with the checked-in file instead of writing")
    args = ap.parse_args(argv)
    text = json.dumps(generate(args.work), indent=1, sort_keys=False) + "\n"
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        print("up to date" if same else f"{args.out} differs from the wheels' source", file=sys.stderr)
        return 0 if same else 1
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
