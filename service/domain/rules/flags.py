"""Flag rules: every engine argument must be a flag the target vLLM version accepts, with a value of the right
kind (the release's parser, generated into service/data/vllm; boolean flags: vllm 0.33.0
vllm/utils/argparse_utils.py:120-145)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from ..config_validators import CHECKS, option_problems
from ..config_values import ABSENT, BadValue, bad_values, problems
from ..context import LaunchContext
from ..engine_args import RULE_RANGES, arg_name, flag
from ..findings import Finding
from ..versions import VersionLine
from . import Emit, rule
from .gating import own_line

SRC_FLAGS = (
    "service/data/vllm/<release>.json (generated from vLLM's parser); boolean flags: vllm 0.33.0 "
    "vllm/utils/argparse_utils.py:120-145 (EnableDisableAction)"
)
SRC_ABBREV = (
    "vllm 0.33.0 vllm/utils/argparse_utils.py:170-180 (FlexibleArgumentParser passes no allow_abbrev: argparse's "
    "default, on); Python 3.12 argparse.py ArgumentParser._parse_optional / _get_option_tuples; per release: "
    "service/data/vllm/<release>.json argparse (scripts/vllm_argparse.py)"
)
MAX_SHOWN = 12  # option strings quoted from an ambiguous match (a short prefix matches dozens)


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
    (``vllm: error: unrecognized arguments``), an unknown flag names the nearest real ones, a prefix of several
    option strings is argparse's ``ambiguous option`` (a prefix of one is that option: ``flag_abbreviated``); a
    boolean flag given a value (``--enforce-eager False``), a value outside the option's ``choices`` (``--dtype
    fp16``), a JSON key the option's config class does not have (``--compilation-config '{"level": 3}'``) and a JSON
    value its pydantic validation refuses (``--structured-outputs-config '{"backend": "xgrammer"}'``, a required key
    missing; also ``--optimization-level O2``, a string the parser passes to an Enum field) and an option's value the
    config-class field it is handed to refuses (``--watermark 1.0``: SchedulerConfig's ``lt=1.0``; ``--media-io-kwargs
    '{"video": 5}'``: a dict of dicts) fail the same way."""
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
    out += _ambiguous(ctx, emit)
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
    # vLLM's own validators first, in vLLM's words; the generated value facts judge what they leave
    by_hand = validator_findings(ctx, emit)
    judged = {f.field.split(".")[1] for f in by_hand if f.field and f.field.startswith("engine_args.")}
    out += by_hand + bad_value_findings(ctx, emit, judged)
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


def _ambiguous(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Keys that are a prefix of several option strings: argparse refuses them (3.12 argparse.py _parse_optional
    'ambiguous option'; candidates listed here sorted, argparse lists them in the order the options were added)."""
    out = []
    for key, (spelled, matches) in ctx.args.ambiguous.items():
        shown = ", ".join(matches[:MAX_SHOWN]) + (f", … ({len(matches)} in all)" if len(matches) > MAX_SHOWN else "")
        dests = list(dict.fromkeys(ctx.line.spellings[m] for m in matches if m in ctx.line.spellings))
        out.append(
            emit.error(
                "flag_unsupported",
                f"{key!r} is a prefix of {len(matches)} option strings of vllm serve {ctx.line.newest}; vLLM exits "
                f"with 'vllm serve: error: ambiguous option: {spelled} could match {shown}'. Give the full option "
                f"name.",
                remedy={"drop": [arg_name(key)], "did_you_mean": dests[:MAX_SHOWN]},
                field=f"engine_args.{key}",
            )
        )
    return out


@rule("flag_abbreviated", severity="warning", source=SRC_ABBREV)
def flag_abbreviated(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """An engine argument given as a unique prefix of an option (``tensor-parallel`` for ``--tensor-parallel-size``):
    the release's parser takes it as that option (argparse's ``allow_abbrev``, which FlexibleArgumentParser leaves on
    in every supported release), so Preflight judges and renders the full option, but says so: the prefix fails
    (``ambiguous option``) on a release that adds another option beginning with it."""
    out = []
    for dest, (key, full) in ctx.args.abbreviated.items():
        out.append(
            emit.warning(
                "flag_abbreviated",
                f"{key!r} abbreviates {full}: vLLM {ctx.version}'s parser reads a unique prefix of an option as that "
                f"option (argparse allow_abbrev), so Preflight judges it as {full} and renders the full spelling. "
                f"Write {full} ({dest}): a release with another option that begins the same way refuses the prefix "
                f"('ambiguous option').",
                remedy={"rename": {key: dest}},
                field=f"engine_args.{key}",
                reference=f"vllm {ctx.line.newest} {ctx.line.parser_source}".strip(),
            )
        )
    return out


def _shown(b: BadValue) -> str:
    return "missing" if b.value is ABSENT else f"= {b.value!r}"[:120]


def _patched(value: dict[str, Any], path: str, allowed: tuple[Any, ...]) -> list[dict[str, Any]] | None:
    """Copies of a JSON value with the one bad key set to each allowed value (a machine-readable remedy)."""
    keys = path.split(".")
    if not allowed or "[" in path:
        return None
    out = []
    for choice in allowed[:8]:
        top = copy = dict(value)
        for k in keys[:-1]:
            if not isinstance(copy.get(k), dict):
                return None
            copy[k] = dict(copy[k])
            copy = copy[k]
        copy[keys[-1]] = choice
        out.append(top)
    return out


def bad_value_findings(ctx: LaunchContext, emit: Emit, judged: set[str]) -> list[Finding]:
    """Values vLLM's config classes refuse (service/domain/config_values.py): inside a JSON option, per dotted
    path; an option with value facts (the parser hands the value on to a pydantic config class field, which
    refuses it: a bound, an Enum, a dict's or list's contents), named ``engine_args.<dest>``. ``judged``: options
    a validator check already refused."""
    out = []
    folds = own_line(ctx)  # names read through a validator: only on the catalogue's own line
    for name, value in ctx.args.values.items():
        opt = ctx.line.options.get(name)
        if opt is None or value is None or name in judged:
            continue
        if opt.json_keys and isinstance(value, dict):
            bad = bad_values(value, opt.json_keys, folds=folds)
            if not bad:
                continue
            cls = opt.json_keys.get("class", "config")
            said = "; ".join(f"{name}.{b.path} {_shown(b)}: {b.problem}" for b in bad)
            fix = _patched(value, bad[0].path, bad[0].allowed) if len(bad) == 1 else None
            message = f"argument {flag(name)}: vLLM {ctx.line.newest}'s {cls} refuses it (pydantic validation): {said}."
            data: dict[str, Any] = {
                "problems": [
                    {"path": f"{name}.{b.path}", "expected": b.problem, "allowed": list(b.allowed)} for b in bad
                ]
            }
        elif opt.value_facts and name not in RULE_RANGES:  # those have a rule with vLLM's own message
            bad = problems(value, opt.value_facts, name, folds=folds)
            if not bad:
                continue
            facts = opt.value_facts
            where = f"{facts.get('class', 'config')}.{facts.get('field', name)}"
            said = "; ".join(f"{b.path} {_shown(b)}: {b.problem}" for b in bad)
            top = bad[0].path == name and len(bad) == 1
            fix = list(bad[0].allowed) if top and bad[0].allowed else None
            message = (
                f"argument {flag(name)}: {repr(value)[:120]} passes vLLM {ctx.line.newest}'s parser but {where} "
                f"refuses it at start-up (pydantic validation): {said}."
            )
            data = {"problems": [{"path": b.path, "expected": b.problem, "allowed": list(b.allowed)} for b in bad]}
            if facts.get("source"):
                data["reference"] = f"vllm {ctx.line.newest} {facts['source']}"
        else:
            continue
        out.append(
            emit.error(
                "flag_unsupported", message, remedy={name: fix} if fix else None, field=f"engine_args.{name}", **data
            )
        )
    return out


def validator_findings(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Values the validators of vLLM's config classes refuse (service/domain/config_validators.py), in vLLM's own
    words; the generated value facts judge the options these leave unrefused."""
    checked = [n for n in ctx.args.values if n in CHECKS and n in ctx.line.options]
    if not checked:  # most launches give none of the options a validator judges
        return []
    names = ctx.line.names if own_line(ctx) else None
    out = []
    for name in checked:
        value = ctx.args.values[name]
        bad, source = option_problems(name, value, ctx.line.release[:2], names)
        if not bad:
            continue
        said = "; ".join(f"{name}{'.' + b.path if b.path else ''} {_shown(b)}: {b.problem}" for b in bad)
        one = bad[0] if len(bad) == 1 and bad[0].allowed else None
        fix = None if one is None else _patched(value, one.path, one.allowed) if one.path else list(one.allowed)
        out.append(
            emit.error(
                "flag_unsupported",
                f"argument {flag(name)}: vLLM {ctx.line.newest} refuses it at start-up (a validator of the config "
                f"class it is handed to): {said}.",
                remedy={name: fix} if fix else None,
                field=f"engine_args.{name}.{bad[0].path}" if bad[0].path else f"engine_args.{name}",
                problems=[
                    {"path": f"{name}.{b.path}" if b.path else name, "expected": b.problem, "allowed": list(b.allowed)}
                    for b in bad
                ],
                reference=source,
            )
        )
    return out
