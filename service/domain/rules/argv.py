"""The signed argv must mean what was validated: rendered, parsed back with the release parser's semantics, and
compared (service/domain/render.py); options that change what is loaded are judged or refused, never passed through
unjudged."""

from __future__ import annotations

from typing import Any

from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule

SRC_RT = "vllm 0.33.0 vllm/utils/argparse_utils.py:313-514 (FlexibleArgumentParser.parse_args); argparse"
SRC_LOAD = "vllm 0.33.0 vllm/engine/arg_utils.py (--config, --model-loader-extra-config, --hf-overrides, --tokenizer)"

# Options whose value changes what is loaded, and what Preflight does with them.
UNJUDGED = {
    "config": "reads further vllm serve arguments from a YAML file on the node, which Preflight never sees",
    "model_loader_extra_config": "passes loader-specific settings (files, URIs, shard patterns) that Preflight "
    "cannot judge",
    "hf_config_path": "loads another config.json than the manifest's, which Preflight never sees",
    "quantization_config": "passes a quantization config that Preflight does not judge (the budget would be that "
    "of the unquantized launch); register the quantized checkpoint as its own manifest, or use --quantization",
}

_EMPTY: tuple[None, dict[str, Any], str] = (
    None,
    {},
    "",
)  # what leaves an UNJUDGED option unset (a module constant: no dict built per rule call)


@rule("argv_roundtrip", "model_reference", severity="error", source=SRC_RT, phase="budget")
def argv_roundtrip(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """The rendered ``vllm serve`` argv, parsed back with the target release's option catalogue and parser
    semantics (``--model`` anywhere is moved to the front, ``--config`` pulls in a file, a value that begins with
    ``-`` is an option, ``nargs='+'`` reads up to the next option), must give exactly the engine arguments that were
    validated; the model reference must be a repository id, an absolute path or an object-store URI."""
    from ..render import render_argv, roundtrip_findings, validated_arguments

    expected = validated_arguments(ctx)  # computed once: rendered from, then compared with what parses back
    argv = render_argv(ctx, args=expected)
    ctx.notes["argv"] = argv  # the validator signs this same argv (validate.py)
    return roundtrip_findings(ctx, argv, emit, expected)


@rule("flag_unjudged", severity="error", source=SRC_LOAD)
def flag_unjudged(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Options that change what is loaded must be judged: ``--hf-overrides`` as a JSON object is applied to the
    config.json before every rule (a function name is refused); ``--tokenizer`` must be a repository id, an absolute
    path or a URI; ``--config``, ``--model-loader-extra-config`` and ``--hf-config-path`` carry what Preflight cannot
    see and are refused, and so are ``--quantization-config`` (not judged) and ``--load-format dummy`` in
    production; ``--revision`` is a warning (what it loads is not judged; other models are named by the loading
    rule). Options that load code on the node (plugins, worker classes,
    middleware, logits processors) need the manifest's ``allow_remote_code`` in production (checked at
    ``POST /v1/plans``)."""
    from ..render import model_reference_problem

    out = []
    for name, why in UNJUDGED.items():
        value = ctx.args.values.get(name)
        if value in _EMPTY:
            continue
        out.append(
            emit.error(
                "flag_unjudged",
                f"--{name.replace('_', '-')} {why}; Preflight refuses to sign a launch whose meaning it has not judged. "
                f"Put the settings in engine_args (or the manifest) instead.",
                remedy={"drop": [name]},
                field=f"engine_args.{name}",
            )
        )
    hf = ctx.args.values.get("hf_overrides")
    if isinstance(hf, str) and hf:
        out.append(
            emit.error(
                "flag_unjudged",
                f"--hf-overrides {hf!r} names a function that rewrites the config at load time; only a JSON object can be "
                f"judged (it is applied to config.json before the rules).",
                remedy={"hf_overrides": "a JSON object"},
                field="engine_args.hf_overrides",
            )
        )
    if ctx.environment == "production" and ctx.args.values.get("load_format") == "dummy":
        out.append(
            emit.error(
                "flag_unjudged",
                "--load-format dummy serves randomly initialised weights, not the manifest's: never in production.",
                remedy={"drop": ["load_format"]},
                field="engine_args.load_format",
            )
        )
    revision = ctx.args.values.get("revision")
    if isinstance(revision, str) and revision:
        out.append(
            emit.warning(
                "flag_unjudged",
                f"--revision {revision!r} loads another commit of the model repository than the one "
                f"whose config.json was judged; register that revision as its own manifest version instead.",
                remedy={"drop": ["revision"]},
                field="engine_args.revision",
            )
        )
    for name in ("tokenizer",):
        value = ctx.args.values.get(name)
        if isinstance(value, str):
            problem = model_reference_problem(value)
            if problem:
                out.append(
                    emit.error(
                        "flag_unjudged", f"--{name}: {problem}.", remedy={"drop": [name]}, field=f"engine_args.{name}"
                    )
                )
    return out
