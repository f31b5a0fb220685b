"""The last checks before vLLM starts, against the plan's signed ``node_checks`` claim
(service/domain/node_checks.py): the GPUs are the ones the plan was validated for (no drift), the weights on disk
are the ones it was judged for (``weights_expected``: domain/weights_expect.py; and the manifest's files when it
recorded them), and every GPU the launch uses has the memory free that vLLM 0.33 will request. A production plan
whose weights cannot be compared (a remote uri with no local mapping) is refused unless it was signed with
``weights_check: "skip"``. When the plan names a signer, or the directory carries an OpenSSF model signature, its
provenance is checked too (agent/provenance.py) and the result handed back in ``found["provenance"]`` for the
``started`` report.

``run_checks`` returns the first failed check as a ``Refusal`` (check, reason, message, details); the boot reports
it (``refused``) and exits without starting vLLM. Plans signed before these checks carry no claim: nothing to
check, said on the console.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..domain import weights_expect as expect
from ..domain.text import printable
from . import gpus as gpu_mod
from . import provenance as provenance_mod
from . import weights as weights_mod


@dataclass
class Refusal:
    check: str  # "gpus", "weights", "gpu memory", "node checks"
    # inventory_drift, weights_mismatch, weights_unverifiable, gpu_memory_busy, nvidia_smi, claim_type,
    # weights_unreadable, signature_failed, signature_missing, signature_unverifiable
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    observed_facts: dict[str, Any] | None = None  # what to send to PUT /v1/nodes/{name}/facts (drift)


def _num(v: Any, lo: float, hi: float) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi


def claim_problem(nc: Any) -> str | None:
    """Why the ``node_checks`` claim is not usable (None when it is). Signed, so a problem here is a service bug,
    still refused rather than half-checked."""
    if not isinstance(nc, dict) or not isinstance(nc.get("hardware"), dict) or not isinstance(nc.get("memory"), dict):
        return "node_checks must hold hardware and memory objects"
    hw, mem = nc["hardware"], nc["memory"]
    if not (
        isinstance(hw.get("count"), int)
        and 1 <= hw["count"] <= 64
        and isinstance(hw.get("gpu_id"), str)
        and _num(hw.get("memory_bytes"), 0, 1 << 50)
    ):
        return "node_checks.hardware needs gpu_id, count (1..64) and memory_bytes"
    if not (
        _num(mem.get("gpu_memory_utilization"), 0.0001, 1)
        and _num(mem.get("gpus", 1), 1, 64)
        and (mem.get("kv_cache_memory_bytes") is None or _num(mem["kv_cache_memory_bytes"], 0, 1 << 50))
        and _num(mem.get("weights_bytes_per_gpu", 0), 0, 1 << 50)
    ):
        return "node_checks.memory has a value of the wrong type or range"
    w = nc.get("weights")
    if w is not None:
        if not isinstance(w, dict) or not isinstance(w.get("shards", []), list) or len(w.get("shards", [])) > 4096:
            return "node_checks.weights must be an object with at most 4096 shards"
        for s in w.get("shards", []):
            if (
                not isinstance(s, dict)
                or weights_mod.shard_name_problem(s.get("name"))
                or not _num(s.get("size"), 0, 1 << 50)
            ):
                return f"node_checks.weights: shard {str(s)[:80]} is not a plain file name with a size"
    if expect.CLAIM in nc:
        return expect.claim_problem(nc[expect.CLAIM])
    return None


def run_checks(
    claims: dict,
    *,
    nvidia_smi: str,
    weights_root: pathlib.Path | None,
    verify_hashes: bool,
    say: Callable[[str], None],
    on_bytes: Callable[[int], None] | None = None,
    layout_reader: weights_mod.LayoutReader = weights_mod.no_layout_reader,
    found: dict[str, Any] | None = None,
    trust_config: pathlib.Path | None = None,
) -> Refusal | None:
    """The checks in order; the first refusal, or None. ``found`` receives what the checks learned that the
    ``started`` report carries (``provenance``)."""
    found = {} if found is None else found
    nc = claims.get("node_checks")
    if nc is None:
        say("the plan carries no node checks (signed before they existed): GPUs, memory and weights not checked")
        return None
    problem = claim_problem(nc)
    if problem:
        return Refusal("node checks", "claim_type", problem)
    hw, mem = nc["hardware"], nc["memory"]

    return (
        _check_gpus(hw, nvidia_smi, say)
        or _check_weights(claims, nc, weights_root, verify_hashes, say, on_bytes, layout_reader)
        or _check_provenance(claims, nc, weights_root, say, found, trust_config)
        or _check_memory(claims, mem, nvidia_smi, say)
    )


def _check_gpus(hw: dict, nvidia_smi: str, say: Callable[[str], None]) -> Refusal | None:
    """1. the GPUs are the ones the plan was validated for."""
    try:
        observed = gpu_mod.read_gpus(nvidia_smi)
        interconnect = (
            gpu_mod.read_interconnect(nvidia_smi, len(observed))
            if hw.get("interconnect") == "nvlink" and len(observed) > 1
            else None
        )
    except gpu_mod.NvidiaSmiError as exc:
        return Refusal("gpus", "nvidia_smi", f"cannot read the node's GPUs: {exc}")
    differences = gpu_mod.drift(observed, hw, interconnect)
    if differences:
        facts = gpu_mod.node_facts(
            observed,
            interconnect
            if interconnect is not None
            else (gpu_mod.read_interconnect_quietly(nvidia_smi, len(observed))),
        )
        mixed = gpu_mod.mixed_models(observed)  # not facts the service takes: said instead of sent
        return Refusal(
            "gpus",
            "inventory_drift",
            "the node's GPUs differ from the hardware the plan was validated for: "
            + "; ".join(differences)
            + (f" ({mixed}: the node's facts are not updated)" if mixed else ""),
            {"differences": differences, "observed": facts},
            observed_facts=None if mixed else facts,
        )
    say(f"GPUs: {len(observed)} × {observed[0].name} as the plan was validated for")
    return None


def _check_weights(
    claims: dict,
    nc: dict,
    weights_root: pathlib.Path | None,
    verify_hashes: bool,
    say: Callable[[str], None],
    on_bytes: Callable[[int], None] | None,
    layout_reader: weights_mod.LayoutReader = weights_mod.no_layout_reader,
) -> Refusal | None:
    """2. the weights on disk are the ones the plan was judged for: the plan's expectation (config digest, tag,
    layout digest: domain/weights_expect.py) and, when the manifest recorded them, its files."""
    record, expected = nc.get("weights"), nc.get(expect.CLAIM)
    if expected is not None and expected["weights_check"] == "skip":
        say(
            "weights: NOT CHECKED: the plan was signed with weights_check skip (audited at plan creation; reason: "
            f"{printable(str(expected.get('skip_reason') or ''))[:300]!r})"
        )
        return None
    if record is None and expected is None:
        say(
            "weights: the plan carries no weights expectation (signed before plans carried one): not checked; "
            "reissue the plan to have the node check its weights"
        )
        return None
    try:
        directory = weights_mod.local_directory(str(claims.get("model_uri", "")), weights_root)
    except weights_mod.WeightsError as exc:
        return Refusal("weights", "weights_unreadable", str(exc))
    if directory is None:
        return _unmapped(str(claims.get("model_uri")), expected, say)
    mismatches: list[weights_mod.Mismatch] = []
    notes: list[str] = []
    if record is not None:  # the file records first: a missing or short shard is said as such
        mismatches = weights_mod.check(directory, record, verify_hashes=verify_hashes, on_bytes=on_bytes)
    if expected is not None:
        seen = {m.file for m in mismatches}  # one line per file: the record's, then the expectation's others
        found, notes = weights_mod.check_expected(directory, expected, layout_reader=layout_reader)
        mismatches += [m for m in found if m.file not in seen]
    if mismatches:
        return Refusal(
            "weights",
            "weights_mismatch",
            f"the weights in {directory} are not the ones the plan was judged for: "
            + "; ".join(m.message() for m in mismatches[:10])
            + (f" (and {len(mismatches) - 10} more)" if len(mismatches) > 10 else ""),
            {
                "directory": str(directory),
                "mismatches": [{"file": m.file, "expected": m.expected, "found": m.found} for m in mismatches[:100]],
            },
        )
    for note in notes:
        say(f"weights: {note}")
    shards = (record or {}).get("shards") or []
    hashed = verify_hashes and any("sha256" in s for s in shards)
    what = f"{len(shards)} shards{', hashes verified' if hashed else ''}" if record is not None else "config and tag"
    say(f"weights: {directory} matches the manifest ({what})")
    return None


def _check_provenance(
    claims: dict,
    nc: dict,
    weights_root: pathlib.Path | None,
    say: Callable[[str], None],
    found: dict[str, Any],
    trust_config: pathlib.Path | None,
) -> Refusal | None:
    """2b. the weights' OpenSSF model signature, after the weights check passed (agent/provenance.py): a plan
    signed with weights_check skip checks none; a directory not on this node has none to check."""
    expected = nc.get(expect.CLAIM)
    if expected is not None and expected["weights_check"] == "skip":
        return None
    try:
        directory = weights_mod.local_directory(str(claims.get("model_uri", "")), weights_root)
    except weights_mod.WeightsError:  # said by the weights check already
        return None
    if directory is None or not directory.is_dir():
        if expected is not None and "signature" in expected:  # a benchmark plan (production refused above)
            found["provenance"] = {"status": "unverified", "message": "the weights are not on this node"}
            say("provenance: unverified: the weights are not on this node to verify their signature")
        return None
    result = provenance_mod.check(directory, expected, trust_config=trust_config)
    found["provenance"] = result.report()
    if not result.refuse:
        say(f"provenance: {result.status}: {result.message}")
        return None
    reason = {"failed": "signature_failed", "unsigned": "signature_missing"}.get(
        result.status, "signature_unverifiable"
    )
    return Refusal("weights", reason, result.message, {"provenance": result.report()})


def _unmapped(model_uri: str, expected: dict | None, say: Callable[[str], None]) -> Refusal | None:
    """A remote model_uri that no --weights-root maps to a local directory: nothing on this node to compare. A
    production plan is refused (``unchecked`` refuse); a benchmark plan, or one signed before expectations, starts
    and the console says the weights were not checked."""
    where = f"{printable(model_uri)[:300]} is remote and no --weights-root maps it to a local directory"
    if expected is None or expected["unchecked"] == "start":
        why = "a benchmark plan" if expected is not None else "a plan signed before weights expectations"
        say(f"weights: {where}: not checked ({why})")
        return None
    return Refusal(
        "weights",
        "weights_unverifiable",
        f"{where}: a production plan does not start on weights nobody compared with what it was judged for "
        f"(give the agent --weights-root DIR with the weights in DIR/<the uri without its scheme>, or sign the "
        f'plan with "weights_check": "skip" and a reason)',
        {"model_uri": printable(model_uri)[:300]},
    )


def _check_memory(claims: dict, mem: dict, nvidia_smi: str, say: Callable[[str], None]) -> Refusal | None:
    """3. free memory, read again right before the start (the most changeable fact)."""
    try:
        observed = gpu_mod.read_gpus(nvidia_smi)
    except gpu_mod.NvidiaSmiError as exc:
        return Refusal("gpus", "nvidia_smi", f"cannot read the node's GPUs: {exc}")
    used = gpu_mod.gpus_used(observed, mem, claims.get("env") or {}, claims.get("argv"))
    short = gpu_mod.memory_shortfalls(used, mem)
    if short:
        procs = gpu_mod.holders(gpu_mod.read_compute_apps(nvidia_smi), [s.gpu for s in short])
        held = "; ".join(
            f"pid {p['pid']} {p['process_name']} holds {p['used_memory_mib']} MiB"
            + (f" on GPU {p['gpu']}" if p["gpu"] is not None else "")
            for p in procs[:8]
        )
        return Refusal(
            "gpu memory",
            "gpu_memory_busy",
            'vLLM 0.33 would refuse to start ("Free memory on device ... is less than desired GPU memory '
            'utilization"): '
            + "; ".join(s.message() for s in short)
            + (f". Processes holding memory: {held}" if held else ". nvidia-smi lists no process holding it"),
            {
                "gpus": [
                    {
                        "index": s.gpu.index,
                        "bus_id": s.gpu.bus_id,
                        "free_bytes": s.gpu.memory_free_bytes,
                        "total_bytes": s.gpu.memory_total_bytes,
                        "needed_bytes": s.needed_bytes,
                        "needed_for": s.why,
                    }
                    for s in short
                ],
                "processes": procs,
            },
        )
    say(f"GPU memory: {len(used)} GPU(s) with the memory vLLM will request free")
    return None


@dataclass(frozen=True)
class NodeProbe:
    """This node as the boot checks see it: ``check`` runs ``run_checks`` against a plan's claims, ``facts`` reads
    the hardware facts nvidia-smi shows (what PUT /v1/nodes/NAME/facts takes). Raises gpus.NvidiaSmiError or
    OSError when nvidia-smi cannot be read."""

    nvidia_smi: str = "nvidia-smi"
    weights_root: pathlib.Path | None = None
    verify_hashes: bool = False
    layout_reader: weights_mod.LayoutReader = weights_mod.no_layout_reader
    sigstore_trust_config: pathlib.Path | None = None  # a Sigstore ClientTrustConfig JSON (offline Sigstore path)

    def check(self, claims: dict, *, say: Callable[[str], None], found: dict | None = None) -> Refusal | None:
        return run_checks(
            claims,
            nvidia_smi=self.nvidia_smi,
            weights_root=self.weights_root,
            verify_hashes=self.verify_hashes,
            say=say,
            layout_reader=self.layout_reader,
            found=found,
            trust_config=self.sigstore_trust_config,
        )

    def facts(self) -> dict:
        observed = gpu_mod.read_gpus(self.nvidia_smi)
        return gpu_mod.node_facts(observed, gpu_mod.read_interconnect_quietly(self.nvidia_smi, len(observed)))
