"""Flag rules: every engine argument must be a flag the target vLLM version accepts, with a value of the right
kind (../shared/vllm-rules.md §8, rules 41-42)."""

from __future__ import annotations

from ..context import LaunchContext
from . import error, rule, warning

SRC_BOOL = "vllm 0.33.0 vllm/utils/argparse_utils.py:120-145 (EnableDisableAction)"


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@rule("flag_unsupported", "flag_unknown", severity="error", source="vllm 0.33.0 vllm/engine/arg_utils.py; vllm-rules.md §8")
def flag_unsupported(ctx: LaunchContext):
    """Flags removed or renamed in the target version are errors (``vllm: error: unrecognized arguments``); a
    boolean flag given a value (``--enforce-eager False``) is an argparse error; a flag outside Preflight's catalogue
    is passed through with a ``flag_unknown`` warning."""
    out = []
    for name, value in ctx.args.unsupported.items():
        removed = ctx.line.removed.get(name)
        if removed:
            out.append(error(
                "flag_unsupported",
                f"{flag(name)} was removed in vLLM {removed.removed_in}; vLLM {ctx.version} exits with "
                f"'vllm: error: unrecognized arguments: {flag(name)} {value}'. {removed.advice[0].upper()}{removed.advice[1:]}.",
                remedy={"drop": [name]}, source=removed.source, field=f"engine_args.{name}",
            ))
        else:
            out.append(warning(
                "flag_unknown",
                f"{flag(name)} is not in Preflight's flag catalogue for vLLM {ctx.line.line}.x; it is rendered as given "
                f"and not verified.",
                remedy=None, source="service/domain/versions.py", field=f"engine_args.{name}",
            ))
    for name, value in ctx.args.bool_with_value.items():
        out.append(error(
            "flag_unsupported",
            f"{flag(name)} is a boolean flag and takes no value: '{flag(name)} {value}' fails with 'unrecognized "
            f"arguments: {value}'. Give true or false; Preflight renders {flag(name)} / --no-{name.replace('_', '-')}.",
            remedy={name: [True, False]}, source=SRC_BOOL, field=f"engine_args.{name}",
        ))
    return out
