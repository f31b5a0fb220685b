"""The bodies of the HTTP API: requests (requests.py: unknown fields refused) and, per domain, the responses
(validated on the way out; the OpenAPI document describes each)."""

from .agent import SIGNED_PLAN, ReportOut
from .audit import AuditListOut, CalibrationOut, CheckpointOut, VerifyOut
from .history import HistoryOut, PlacementsOut, RunsOut
from .manifests import ManifestFullOut, ManifestListOut, ManifestOut
from .nodes import NodeFactsOut, NodeListOut, NodeOut, NodeRegisteredOut, NodeTokenOut, NodeViewOut
from .ops import HealthOut, JwksOut, KeysetsOut, ReadyOut
from .plans import DryRunOut, JudgementOut, PlanCreatedOut, PlanListOut, PlanOut, UpgradeImpactOut
from .requests import (
                       ADDRESS_DOC,
                       MAX_ENV_BYTES,
                       MAX_ROLLOUT_NODES,
                       NAME,
                       GatesIn,
                       LaunchTarget,
                       ManifestIn,
                       MetricsWindowIn,
                       NodeFactsIn,
                       NodeIn,
                       NodeUpdate,
                       ObservedGpuIn,
                       PlanIn,
                       ReportIn,
                       RolloutCommandIn,
                       RolloutIn,
                       SelectorIn,
                       Strict,
                       TokenIn,
                       TuningIn,
                       WaveIn,
                       WeightsFiles,
                       WeightsShard,
)
from .rollouts import RolloutCreatedOut, RolloutListOut, RolloutOut
from .tokens import TokenCreatedOut, TokenListOut, TokenOut
from .tuning import TuningPlanOut, TuningStatusOut, WindowRecordedOut

__all__ = [
    "ADDRESS_DOC", "MAX_ENV_BYTES", "MAX_ROLLOUT_NODES", "NAME", "SIGNED_PLAN",
    "AuditListOut", "CalibrationOut", "CheckpointOut", "DryRunOut", "GatesIn", "HealthOut", "HistoryOut", "JwksOut",
    "JudgementOut", "KeysetsOut", "LaunchTarget", "ManifestFullOut", "ManifestIn", "ManifestListOut", "ManifestOut",
    "MetricsWindowIn", "NodeFactsIn", "NodeFactsOut", "NodeIn", "NodeListOut", "NodeOut", "NodeRegisteredOut",
    "NodeTokenOut", "NodeUpdate", "NodeViewOut", "ObservedGpuIn", "PlacementsOut", "PlanCreatedOut", "PlanIn",
    "PlanListOut", "PlanOut", "ReadyOut", "ReportIn", "ReportOut", "RolloutCommandIn", "RolloutCreatedOut",
    "RolloutIn", "RolloutListOut", "RolloutOut", "RunsOut", "SelectorIn", "Strict", "TokenCreatedOut", "TokenIn",
    "TokenListOut", "TokenOut", "TuningIn", "TuningPlanOut", "TuningStatusOut", "UpgradeImpactOut", "VerifyOut",
    "WaveIn", "WeightsFiles", "WeightsShard", "WindowRecordedOut",
]
