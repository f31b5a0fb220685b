"""Flag rules: every engine argument must be a flag the target vLLM version accepts, with a value of the right
kind (the release's parser, generated into service/data/vllm; boolean flags: vllm 0.33.0
vllm/utils/argparse_utils.py:120-145)."""

from __future__ import annotations

from functools import lru_cache

from ..context import LaunchContext
from ..engine_args import flag
from ..findings import Finding
from ..versions import VersionLine
from . import Emit, rule

SRC_FLAGS = (
    "service/data/vllm/<release>.json (generated from vLLM's parser); boolean flags: vllm 0.33.0 "
    "vllm/utils/argparse_utils.py:120-145 (EnableDisableAction)"
)


@lru_cache(maxsize=4096)
def _nearest(name: str, names: tuple[str, ...], n: int) -> tuple[str, ...]:
    import difflib

    return tuple(difflib.get_close_matches(name, names, n=n, cutoff=0.6))


def nearest(name: str, line: VersionLine, n: int = 3) -> list[str]:
    """The release's option names nearest to ``name`` (did you mean ...?); cached, so a request full of near-miss
    names costs one comparison per name, not one per re-validation."""
    return list(_nearest(name[:96], line.option_names, n))


@rule("flag_unsupported", severity="error", source=SRC_FLAGS)
def flag_unsupported(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Every engine argument must be an option of the target release's ``vllm serve`` (its parser, generated into
    service/data/vllm), with a valid value: flags removed or renamed are errors with the release that removed them
    (``vllm: error: unrecognized arguments``), an unknown flag names the nearest real ones; a boolean flag given a
    value (``--enforce-eager False``), a value outside the option's ``choices`` (``--dtype fp16``) and a JSON key the
    option's config class does not have (``--compilation-config '{"level": 3}'``) fail the same way."""
    out = []
    for name, value in ctx.args.unsupported.items():
        removed = ctx.line.removed.get(name)
        if removed:
            out.append(
                emit.error(
                    "flag_unsupported",
                    f"{flag(name)} was removed {removed.when}; vLLM {ctx.version} exits with "
                    f"'vllm: error: unrecognized arguments: {flag(name)} {value}'. {removed.advice[0].upper()}{removed.advice[1:]}.",
                    remedy={"drop": [name]},
                    field=f"engine_args.{name}",
                    reference=removed.source,
                )
            )
        else:
            close = nearest(name, ctx.line)
            hint = f" Did you mean {', '.join(flag(c) for c in close)}?" if close else ""
            out.append(
                emit.error(
                    "flag_unsupported",
                    f"{flag(name)} is not an option of vllm serve {ctx.line.newest} (the {ctx.line.line}.x line); vLLM exits "
                    f"with 'vllm: error: unrecognized arguments: {flag(name)}'.{hint}",
                    remedy={"drop": [name], **({"did_you_mean": close} if close else {})},
                    field=f"engine_args.{name}",
                )
            )
    for name, (value, choices) in ctx.args.bad_choice.items():
        out.append(
            emit.error(
                "flag_unsupported",
                f"argument {flag(name)}: invalid choice: {value!r} (choose from {', '.join(map(repr, choices))}).",
                remedy={name: list(choices)},
                field=f"engine_args.{name}",
            )
        )
    for name, (path, known) in ctx.args.bad_keys.items():
        close = list(_nearest(path.rsplit(".", 1)[-1][:96], known, 3))
        out.append(
            emit.error(
                "flag_unsupported",
                f"argument {flag(name)}: {path!r} is not a field of vLLM {ctx.line.newest}'s config for this option "
                f"(pydantic: Unexpected keyword argument)."
                + (f" Did you mean {', '.join(map(repr, close))}?" if close else f" Known: {', '.join(known[:40])}."),
                remedy={"drop": [f"{name}.{path}"], **({"did_you_mean": close} if close else {})},
                field=f"engine_args.{name}",
            )
        )
    for name, value in ctx.args.bool_with_value.items():
        opt = ctx.line.options[name]
        neg = opt.negative_flag
        out.append(
            emit.error(
                "flag_unsupported",
                f"{opt.flag} is a boolean flag and takes no value: '{opt.flag} {value}' fails with 'unrecognized "
                f"arguments: {value}'. Give true or false; Preflight renders {opt.flag}"
                + (f" / {neg}." if neg else "."),
                remedy={name: [True, False]},
                field=f"engine_args.{name}",
            )
        )
    return out
