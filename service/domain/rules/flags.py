"""Flag rules: every engine argument must be a flag the target vLLM version accepts, with a value of the right
kind (../shared/vllm-rules.md §8, rules 41-42)."""

from __future__ import annotations

from ..context import LaunchContext
from . import error, rule, warning

SRC_BOOL = "vllm 0.33.0 vllm/utils/argparse_utils.py:120-145 (EnableDisableAction)"


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# argparse ``choices`` of flags whose value vLLM checks before anything else (vllm 0.33.0 vllm/config/model.py:100)
CHOICES = {"dtype": ("auto", "half", "float16", "bfloat16", "float", "float32")}


@rule("flag_unsupported", severity="error", source="vllm 0.33.0 vllm/engine/arg_utils.py; vllm-rules.md §8")
def flag_unsupported(ctx: LaunchContext):
    """Every engine argument must be a flag the target version accepts, with a valid value: flags removed or
    renamed are errors (``vllm: error: unrecognized arguments``), and so is any flag outside Preflight's catalogue of
    the version (vLLM exits on an unknown argument; a real flag missing from the catalogue is added there); a boolean
    flag given a value (``--enforce-eager False``) and a value outside argparse's choices (``--dtype fp16``) fail
    the same way."""
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
            out.append(error(
                "flag_unsupported",
                f"{flag(name)} is not a `vllm serve` flag Preflight knows for vLLM {ctx.line.line}.x; vLLM exits with "
                f"'unrecognized arguments' on an unknown flag. Drop it (if it is a real flag of this version, it "
                f"belongs in service/domain/versions.py).",
                remedy={"drop": [name]}, source="service/domain/versions.py", field=f"engine_args.{name}",
            ))
    for name, choices in CHOICES.items():
        value = ctx.args.values.get(name)
        if value is not None and str(value) not in choices:
            out.append(error(
                "flag_unsupported",
                f"argument {flag(name)}: invalid choice: {value!r} (choose from {', '.join(map(repr, choices))}).",
                remedy={name: list(choices)}, source="vllm 0.33.0 vllm/config/model.py:100", field=f"engine_args.{name}",
            ))
    for name, value in ctx.args.bool_with_value.items():
        out.append(error(
            "flag_unsupported",
            f"{flag(name)} is a boolean flag and takes no value: '{flag(name)} {value}' fails with 'unrecognized "
            f"arguments: {value}'. Give true or false; Preflight renders {flag(name)} / --no-{name.replace('_', '-')}.",
            remedy={name: [True, False]}, source=SRC_BOOL, field=f"engine_args.{name}",
        ))
    return out
