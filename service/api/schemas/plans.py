"""Launch judgements and plans."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .base import JSON, Out, WarningOut


class FindingOut(Out):
    """What one rule says about the launch."""

    rule: str = Field(description="The rule's code (docs/rules.md).")
    severity: Literal["error", "warning", "info"] = Field(
        description="error (vLLM would refuse, or the policy profile refuses), warning or info."
    )
    message: str = Field(description="What the rule found, with the numbers.")
    remedy: dict[str, Any] | None = Field(
        description="Machine-readable fix (e.g. the tensor_parallel_size values that would pass), when there is one."
    )
    source: str = Field(description="The vLLM source or guide section the rule mirrors.")
    field: str | None = Field(default=None, description="The request field it is about, when there is one.")
    data: dict[str, Any] | None = Field(
        default=None,
        description=(
            "The figures behind it, when the rule gives them; for an operator rule, ``policy``: the profile and the "
            "action it took (enforce or warn)."
        ),
    )


class PolicyOut(Out):
    """The policy profile a launch was judged under (docs/configuration.md#policy-profiles)."""

    name: str = Field(description="The profile's name (default: the shipped one).")
    digest: str = Field(description="sha256: over the complete profile as canonical JSON.")


class GivenOut(Out):
    """A launch posted as an argv: the argv as posted, and the engine arguments the release's parser reads from it
    (what was judged, before any recommended value was filled in)."""

    argv: list[str] = Field(description="The argv as posted.")
    engine_args: JSON = Field(description="The engine arguments it was read as, by dest name.")


class JudgementOut(Out):
    """``POST /v1/validate``: the verdict on a launch given inline."""

    verdict: Literal["accept", "warn", "reject"] = Field(description="accept, warn or reject.")
    findings: list[FindingOut] = Field(description="Every rule's finding, errors first.")
    argv: list[str] = Field(description="The ``vllm serve`` argv (rendered even for a rejection).")
    command: str = Field(description="The argv as one shell command line.")
    vllm_version: str = Field(description="The vLLM release it was judged against.")
    effective: JSON = Field(description="The engine arguments as vLLM would resolve them.")
    budget: JSON | None = Field(description="The memory budget per GPU (weights, activations, KV cache, tokens).")
    recommendations: list[JSON] = Field(description="Values filled in for a workload, each with why.")
    alternatives: list[JSON] = Field(description="The nearest launches that pass (for a rejection).")
    policy: PolicyOut = Field(description="The policy profile it was judged under.")


class UpgradeFindingOut(Out):
    rule: str | None = Field(description="The rule (or ``invalid``) that breaks.")
    severity: str = Field(description="``error``.")
    message: str = Field(description="Why, for people.")
    remedy: dict[str, Any] | None = Field(default=None, description="Machine-readable fix, when there is one.")
    source: str | None = Field(default=None, description="The vLLM source the rule mirrors, when a rule judged it.")
    field: str | None = Field(default=None, description="The field it is about, when there is one.")
    data: dict[str, Any] | None = Field(default=None, description="The figures behind it, when the rule gives them.")


class UpgradePlanOut(Out):
    plan: str = Field(description="Plan id.")
    status: str = Field(description="The plan's status.")
    manifest: str = Field(description="``name@version``.")
    nodes: list[str] = Field(description="The nodes it is current on.")
    from_version: str | None = Field(description="The vLLM release it was signed for.")
    to_version: str = Field(description="The release it was judged against.")
    breaks: bool = Field(description="vLLM ``to_version`` would refuse it.")
    verdict: str = Field(description="accept, warn, reject or invalid (it cannot be judged at all).")
    findings: list[UpgradeFindingOut] = Field(description="The errors that break it.")
    argv: list[str] | None = Field(default=None, description="The argv under ``to_version`` (when it was judged).")


class UpgradeImpactOut(Out):
    vllm_version: str = Field(description="The version judged against, resolved.")
    catalogue: str = Field(description="The newest release Preflight knows of that line.")
    checked: int = Field(description="Plans re-validated.")
    breaking: int = Field(description="How many would break.")
    truncated: bool = Field(description="More plans exist than were checked (the newest are).")
    plans: list[UpgradePlanOut] = Field(description="Breaking plans first.")


class TopologyOut(Out):
    form: str | None = Field(description="replicas, nnodes or data_parallel.")
    nodes_per_instance: int | None = Field(description="Nodes one instance of the model spans.")


class AssignmentOut(Out):
    node: str = Field(description="Node name.")
    seq: int = Field(description="The node's seq of this plan.")
    status: str = Field(description="active, superseded or revoked.")
    signed: str | None = Field(description="The node's signed plan (compact JWS); null for auditors.")
    last_report: str | None = Field(description="The agent's last report on it.")
    group: int | None = Field(description="The node's group (instance) in the plan.")
    rank: int | None = Field(description="Its rank in the group.")
    role: str | None = Field(description="replica, head or worker.")
    group_digest: str | None = Field(description="Digest of the group's content (every member signs the same).")
    argv: list[str] | None = Field(
        default=None, description="The argv this node runs (present for plans with a topology)."
    )


class GroupOut(Out):
    group: int | None = Field(description="Group index.")
    nodes: list[str] | None = Field(description="Its nodes in rank order.")
    head: str | None = Field(description="The rank-0 node.")
    head_address: str | None = Field(description="Where the members reach the head (multi-node groups).")
    nnodes: int | None = Field(description="Nodes in the group.")
    digest: str | None = Field(description="The group digest.")
    status: str | None = Field(description="revoked, superseded, failed, running, stopped, starting or pending.")
    env: dict[str, str] | None = Field(
        default=None, description="The group's own env (values redacted for auditors), when it has one."
    )


class PlanOut(Out):
    id: str = Field(description="Plan id.")
    status: str = Field(description="active, superseded or revoked.")
    verdict: str = Field(description="accept or warn.")
    findings: list[FindingOut] = Field(description="Every rule's finding.")
    argv: list[str] = Field(description="The ``vllm serve`` argv (a single-node plan's; multi-node: per assignment).")
    command: str = Field(description="The argv and env as one shell command line.")
    env: dict[str, str] | None = Field(description="The env the nodes run vLLM with (values redacted for auditors).")
    budget: JSON | None = Field(description="The memory budget per GPU.")
    vllm_version: str | None = Field(description="The vLLM release it was validated for.")
    manifest_id: int = Field(description="The manifest's id.")
    created_by: str = Field(description="Who created it.")
    created_at: str | None = Field(description="When (ISO 8601).")
    tuning: JSON | None = Field(description="The tuning loop's memo (its SLO, auto_apply, the levels that held).")
    policy: PolicyOut | None = Field(
        default=None, description="The policy profile that judged it; null for plans older than policy profiles."
    )
    given: GivenOut | None = Field(
        default=None, description="What was posted, for a launch posted as an argv (null for engine_args)."
    )
    weights_check: JSON | None = Field(
        default=None,
        description=(
            'How its nodes check the weights: {"mode": "verify"}, or {"mode": "skip", "reason", "requested_by"} '
            "for a plan signed with weights_check skip (audited plan.weights_check_skipped); null for plans older "
            "than weights expectations."
        ),
    )
    topology: TopologyOut | None = Field(
        default=None, description="How its nodes form instances (present for plans made with topologies)."
    )
    assignments: list[AssignmentOut] | None = Field(
        default=None,
        description=("Per node: seq, status, last report, place in its group (present where the plan is shown whole)."),
    )
    signed: str | None = Field(
        default=None,
        description="The first node's signed plan (null for auditors; present "
        "with the assignments when there are some).",
    )
    groups: list[GroupOut] | None = Field(
        default=None,
        description="Per group: nodes, head, digest, state (present with the assignments for plans with a topology).",
    )


class PlanCreatedOut(PlanOut):
    recommendations: list[JSON] | None = Field(description="Values filled in for a workload, each with why.")
    warnings: list[WarningOut] | None = Field(
        default=None,
        description=("Present when an unfinished rollout holds some of the nodes (``rollout_in_progress``)."),
    )


class PlanListItemOut(PlanOut):
    model: str = Field(description="The manifest's name.")
    manifest: str = Field(description="``name@version``.")


class PlanListOut(Out):
    items: list[PlanListItemOut] = Field(description="Plans, newest first.")
    next: str | None = Field(description="The cursor of the next page (pass it as ``after``); null on the last page.")


class DryRunOut(Out):
    """``POST /v1/plans?dry_run=true``: what the plan would be; nothing stored, nothing signed."""

    dry_run: Literal[True] = Field(description="Always true.")
    verdict: str = Field(description="accept or warn (a rejection is the 422).")
    findings: list[FindingOut] = Field(description="Every rule's finding.")
    argv: list[str] = Field(description="The ``vllm serve`` argv.")
    command: str = Field(description="The argv and env as one shell command line.")
    env: dict[str, str] = Field(description="The env vLLM would run with.")
    budget: JSON | None = Field(description="The memory budget per GPU.")
    vllm_version: str = Field(description="The vLLM release it was judged against.")
    recommendations: list[JSON] = Field(description="Values filled in for a workload, each with why.")
    alternatives: list[JSON] = Field(description="The nearest launches that pass.")
    policy: PolicyOut = Field(description="The policy profile it was judged under.")
    given: GivenOut | None = Field(default=None, description="What was posted, for a launch posted as an argv.")
    manifest: str = Field(description="``name@version``.")
    nodes: list[str] = Field(description="The nodes, in the order given.")
    nodes_per_instance: int = Field(description="Nodes one instance spans.")
