"""What the engine arguments would make a node load, from the release's own loading facts (service/domain/loading.py):
files written, paths read in production, secrets in the argv, other weights. Code loading needs the manifest
(``allow_remote_code``) and is judged when a plan is made (services/plan_layout.py ``check_node_safety``)."""

from __future__ import annotations

from ..context import LaunchContext
from ..findings import Finding
from ..loading import judge, option_loads, option_of
from . import Emit, rule

SRC = (
    "the release's loading facts: scripts/vllm_loading.py over the wheel's source, checked in as `loading` in "
    "service/data/vllm/<release>.json (each finding names the file and line)"
)


@rule("write_not_allowed", "path_not_allowed", "secret_in_engine_args", "other_weights", severity="error", source=SRC)
def loading(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """An option or nested JSON field (at any depth, list items too) whose value the release writes files to is
    refused; one it reads a file from or downloads into is refused in production (the node decides where files and
    weights come from); a secret (``--api-key``, ``--hf-token``) is refused as an engine argument, since the argv is
    signed and shown to auditors (put it in the plan's env, whose values are redacted); another model, tokenizer or
    adapter is named in a warning, its weights not judged."""
    loads = option_loads(ctx.args.values, ctx.line.loading)  # code is judged with the manifest (plan_layout.py)
    out = []
    for v in judge(loads, environment=ctx.environment, allow_remote_code=None):
        build = emit.error if v.severity == "error" else emit.warning
        out.append(build(v.rule, v.message, remedy={"drop": [option_of(v.field)]}, field=v.field))
    return out
