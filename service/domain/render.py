"""Rendering: a validated launch as the exact ``vllm serve`` argv for the target version, its shell form, and the
proof that the argv means what was validated.

Rules (vllm 0.33.0 vllm/entrypoints/cli/serve.py:166-170; vllm/utils/argparse_utils.py:120-145): the model is
the first positional argument; every option is rendered with the
spelling the target release's parser defines (service/data/vllm/<release>.json): booleans as ``--x`` / ``--no-x``
(or ``--enable-x`` / ``--disable-x`` where the release pairs them), never ``--enforce-eager False``; list options
as one flag followed by its values (append options repeat the flag); JSON options as one compact JSON argument.
Flags the version does not accept are never rendered. ``--quantization`` comes from the weight's quantization.txt
tag (online ``fp8`` becomes ``fp8_per_tensor``), never from a human. The values a production plan must pin — TP,
max_model_len, gpu_memory_utilization, max_num_seqs, max_num_batched_tokens — are always rendered with their
effective values, so the node runs exactly what was judged.

``parse_argv`` reads an argv back with the semantics of vLLM's FlexibleArgumentParser (vllm 0.33.0
vllm/utils/argparse_utils.py:313-514: ``--model`` anywhere is moved to the front, ``--config`` pulls in a file,
``-O<n>`` is rewritten, dotted ``--x.y`` keys are merged into JSON) and argparse (an element that begins with ``-``
is an option, ``nargs='+'`` takes values up to the next option, the last occurrence wins). ``roundtrip_findings``
refuses a launch whose rendered argv would not parse back to exactly the validated arguments.
"""

from __future__ import annotations

import json
import re
import shlex
import threading
import unicodedata
from typing import Any

from .context import LaunchContext
from .engine_args import coerce, expand_json_numbers, scalar
from .findings import Finding
from .rules import Emit
from .rules.quantization import effective_quantization
from .text import display_text_problem
from .versions import K_BOOL, K_BOOL_VALUE, K_FLAG, K_JSON, K_JSON_OR_STR, Option, VersionLine

PINNED = ("tensor_parallel_size", "max_model_len", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens")
SKIP = {"quantization"}  # rendered from the tag
# A model reference: a Hugging Face repository id, an absolute path, or an object-store URI (runai streamer)
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")
_PATH = re.compile(r"/[^\x00-\x20\x7f]{0,4095}")
_URI = re.compile(r"(s3|gs|az)://[A-Za-z0-9][^\x00-\x20\x7f]{0,4095}")
_ASCII_SPACE_OR_CONTROL = re.compile(r"[\x00-\x20\x7f]")  # the ASCII characters of categories Cc and Zs


def model_reference_problem(ref: str) -> str | None:
    """Why ``ref`` cannot be vllm serve's positional model argument, or None."""
    if not ref:
        return "the model reference is empty"
    if ref.startswith("-"):
        return f"model reference {ref!r} begins with '-': vLLM's parser would read it as an option"
    if ".." in ref.split("/") or "/../" in ref:
        return f"model reference {ref!r} contains '..'"
    if (
        _ASCII_SPACE_OR_CONTROL.search(ref)
        if ref.isascii()
        else display_text_problem(ref) or any(unicodedata.category(c) == "Zs" for c in ref)
    ):
        return f"model reference {ref!r} contains spaces or invisible formatting characters"
    if _URI.fullmatch(ref) or _PATH.fullmatch(ref) or (_REPO_ID.fullmatch(ref) and ".." not in ref):
        return None
    return (
        f"model reference {ref!r} is neither a Hugging Face repository id (org/name), an absolute path, nor an "
        f"s3:// / gs:// / az:// URI"
    )


def _value_strings(opt: Option, value: Any) -> list[str]:
    if (opt.kind is K_JSON or opt.kind is K_JSON_OR_STR) and isinstance(value, (dict, list)):
        return [json.dumps(value, separators=(",", ":"), sort_keys=True)]
    if isinstance(value, float):
        return [repr(round(value, 6))]
    return [str(value)]


def render_option(opt: Option, value: Any) -> list[str]:
    """One option and its value(s) as argv elements."""
    if value is None:
        return []
    if opt.kind is K_BOOL:
        if value:
            return [opt.flag]
        return [opt.negative_flag] if opt.negative_flag else []
    if opt.kind is K_FLAG:
        return [opt.flag] if value else []
    if opt.kind is K_BOOL_VALUE:
        return [opt.flag, "true" if value else "false"]
    if value is True and opt.nargs == "?":
        return [opt.flag]
    if opt.is_list:
        items = value if isinstance(value, list) else [value]
        if opt.appends:
            return [x for v in items for x in (opt.flag, *_value_strings(opt, v))]
        return [opt.flag, *[x for v in items for x in _value_strings(opt, v)]]
    return [opt.flag, *_value_strings(opt, value)]


def model_reference(ctx: LaunchContext) -> str:
    m = ctx.request.model
    return m.uri or m.name or m.path or "model"


def validated_arguments(ctx: LaunchContext) -> dict[str, Any]:
    """The engine arguments the argv must carry: the pinned effective values, the quantization from the tag, and
    every other given value, by dest."""
    out: dict[str, Any] = {
        "tensor_parallel_size": ctx.tp,
        "max_model_len": ctx.max_model_len,
        "gpu_memory_utilization": round(ctx.gpu_memory_utilization, 6),
        "max_num_seqs": ctx.max_num_seqs,
        "max_num_batched_tokens": ctx.max_num_batched_tokens,
    }
    if ctx.pp > 1:
        out["pipeline_parallel_size"] = ctx.pp
    quant = effective_quantization(ctx)
    if quant:
        out["quantization"] = quant
    for name, value in ctx.args.values.items():
        if name in PINNED or name in SKIP or name == "pipeline_parallel_size" or value is None:
            continue
        opt = ctx.line.options[name]
        if opt.kind is K_FLAG and not value:
            continue
        if opt.kind is K_BOOL and not value and not opt.negative_flag:
            continue
        out[name] = round(value, 6) if isinstance(value, float) else value
    return out


def render_argv(ctx: LaunchContext, model: str | None = None, args: dict[str, Any] | None = None) -> list[str]:
    """``["vllm", "serve", MODEL, "--flag", "value", ...]`` in a stable order: pinned values first, then the other
    given arguments alphabetically. Only options the target release defines are rendered. ``args``: the
    ``validated_arguments(ctx)`` the caller already holds (the round trip compares against the same dict)."""
    argv = ["vllm", "serve", model or model_reference(ctx)]
    if args is None:
        args = validated_arguments(ctx)
    order = [n for n in PINNED] + (["pipeline_parallel_size"] if "pipeline_parallel_size" in args else [])
    order += ["quantization"] if "quantization" in args else []
    order += sorted(n for n in args if n not in order)
    for name in order:
        opt = ctx.line.options.get(name)
        if opt is not None:
            argv += render_option(opt, args[name])
    return argv


def shell_command(argv: list[str], env: dict[str, str] | None = None) -> str:
    """The argv as one shell-quoted line, environment assignments first."""
    prefix = [f"{k}={shlex.quote(v)}" for k, v in sorted((env or {}).items())]
    return " ".join(prefix + [shlex.quote(x) for x in argv])


# ------------------------------------------------------------------------------------------------ the round trip


class ArgvError(ValueError):
    pass


_NEGATIVE_NUMBER = re.compile(r"^-\d+$")  # argparse also takes -1.5, but vLLM reads any '-…' with a '.' as a dotted key


def _looks_like_option(arg: str) -> bool:
    # argparse: a string that begins with '-' is an option unless it looks like a negative number (and the parser
    # has no option that looks like one — vLLM's has none)
    return arg[:1] == "-" and arg != "-" and not (arg[1:2].isdigit() and _NEGATIVE_NUMBER.match(arg))


def _refuse_rewrites(rest: list[str]) -> None:
    """Elements vLLM's parser rewrites before argparse reads them: ``--model`` anywhere, ``--config``, ``-O…``."""
    for arg in rest:
        if arg[:2] not in ("--", "-O"):
            continue
        if arg == "--model" or arg.startswith("--model="):
            raise ArgvError(f"{arg!r}: vLLM moves any '--model' element to the front and loads that model")
        if arg == "--config" or arg.startswith("--config="):
            raise ArgvError(f"{arg!r}: vLLM reads further arguments from a config file")
        if arg.startswith("-O"):
            raise ArgvError(f"{arg!r}: vLLM rewrites '-O…' to --optimization-level")


def parse_argv(argv: list[str], line: VersionLine) -> tuple[str, dict[str, Any]]:
    """Read ``vllm serve MODEL ...`` the way the release's parser would: returns (model, {dest: value}) with values
    typed as parse_engine_args types them. Raises ArgvError for anything vLLM would read differently from a plain
    left-to-right reading (a relocated ``--model``, ``--config``, ``-O``, dotted keys, an unknown option, a value
    that is an option, a repeated option)."""
    if argv[:2] != ["vllm", "serve"] or len(argv) < 3:
        raise ArgvError("the argv must start with 'vllm serve MODEL'")
    rest = argv[2:]
    _refuse_rewrites(rest)
    model = rest[0]
    if _looks_like_option(model):
        raise ArgvError(f"the model argument {model!r} would be read as an option")
    values: dict[str, Any] = {}
    i = 1
    while i < len(rest):
        arg = rest[i]
        if not _looks_like_option(arg):
            raise ArgvError(f"{arg!r} is a value that no option takes (vllm: error: unrecognized arguments)")
        key, eq, inline = arg.partition("=")
        if "." in key:
            raise ArgvError(f"{arg!r}: dotted keys are merged into a JSON option by vLLM's parser")
        if "_" in key and key.startswith("--"):  # (without an underscore the spelling is already dashed)
            key = "--" + key[2:].replace("_", "-")
        dest = line.spellings.get(key)
        if dest is None:
            raise ArgvError(f"{key!r} is not an option of vLLM {line.newest}")
        if dest in values:
            raise ArgvError(f"{key!r} appears twice (the last occurrence would win)")
        opt = line.options[dest]
        i += 1
        if opt.kind is K_BOOL or opt.kind is K_FLAG:
            if eq:
                raise ArgvError(f"{arg!r}: a boolean flag takes no value")
            values[dest] = key not in opt.negative if opt.kind is K_BOOL else True
            continue
        if opt.kind is K_BOOL_VALUE:
            text = inline if eq else (rest[i] if i < len(rest) and not _looks_like_option(rest[i]) else None)
            if text is None or text.lower() not in ("true", "false"):
                raise ArgvError(f"{key!r} expects true or false")
            i += 0 if eq else 1
            values[dest] = text.lower() == "true"
            continue
        taken: list[str] = [inline] if eq else []
        if opt.nargs == "?" and not eq and (i >= len(rest) or _looks_like_option(rest[i])):
            values[dest] = opt.const
            continue
        if not eq and not opt.is_list and i < len(rest) and rest[i][:1] != "-":
            taken.append(rest[i])  # one value that cannot be an option or a dotted key: the loop below, in short
            i += 1
        elif not eq:
            want_many = opt.is_list and not opt.appends
            while i < len(rest) and not _looks_like_option(rest[i]):
                if rest[i][:1] == "-" and "." in rest[i]:
                    raise ArgvError(
                        f"{rest[i]!r}: vLLM reads an element that begins with '-' and holds a '.' as a "
                        f"dotted key, not as the value of {key}"
                    )
                taken.append(rest[i])
                i += 1
                if not want_many:
                    break
        if not taken:
            raise ArgvError(f"{key!r} expects a value")
        if opt.appends:
            # repeated flags: gather the following occurrences of the same option
            while i + 1 < len(rest) and line.spellings.get(rest[i]) == dest:
                taken.append(rest[i + 1])
                i += 2
        try:
            if opt.action == "LoRAParserAction":
                values[dest] = coerce(dest, opt, taken)
            elif opt.is_list:
                values[dest] = [read_value(dest, opt, t) for t in taken]
            else:
                values[dest] = read_value(dest, opt, taken[0])
        except Exception as e:  # noqa: BLE001 - any parse failure means the argv does not say what was judged
            raise ArgvError(f"{key} {taken!r}: {e}") from None
    return model, values


_PARSED_BACK: dict[tuple[int, tuple[str, ...]], tuple[VersionLine, str, dict[str, Any]]] = {}
_PARSED_BACK_MAX = 512
_PARSED_BACK_ARGV_CHARS = 8192  # a real launch's argv is well under 2,000 characters
_PARSED_BACK_LOCK = threading.Lock()


def _parsed_back(argv: tuple[str, ...], line: VersionLine) -> tuple[str, dict[str, Any]]:
    """``parse_argv`` remembered for the round trip: a pure function of the argv and the release line, and the same
    rendered argv recurs for every node of a rollout and every plan of one launch. The result is only compared,
    never changed; an ArgvError is not remembered. Keyed by the line's identity (the entry keeps the line, so the
    id cannot be reused while the entry lives); at most ``_PARSED_BACK_MAX`` entries of argvs
    up to ``_PARSED_BACK_ARGV_CHARS`` characters, the oldest dropped first."""
    key = (id(line), argv)
    hit = _PARSED_BACK.get(key)
    if hit is not None and hit[0] is line:
        return hit[1], hit[2]
    model, parsed = parse_argv(list(argv), line)
    if sum(map(len, argv)) > _PARSED_BACK_ARGV_CHARS:  # the cache stays small whatever the requests hold
        return model, parsed
    with _PARSED_BACK_LOCK:  # validation runs in worker threads too
        while len(_PARSED_BACK) >= _PARSED_BACK_MAX:
            del _PARSED_BACK[next(iter(_PARSED_BACK))]
        _PARSED_BACK[key] = (line, model, parsed)
    return model, parsed


def read_value(dest: str, opt: Option, text: str) -> Any:
    """One argv element as the option's ``type`` callable reads it (a JSON option's text as JSON)."""
    kind = opt.kind
    if kind is K_JSON or (kind is K_JSON_OR_STR and text.lstrip().startswith("{")):
        return json.loads(expand_json_numbers(text, dest) if opt.json_numbers else text)
    return scalar(dest, opt, text)


def roundtrip_findings(
    ctx: LaunchContext, argv: list[str], emit: Emit, expected: dict[str, Any] | None = None
) -> list[Finding]:
    """The rendered argv, parsed back, must give exactly the validated arguments and the intended model (the
    ``argv_roundtrip`` rule's findings, built with its ``emit``). ``expected``: ``validated_arguments(ctx)`` when
    the caller already computed it (it is not modified)."""
    if len(argv) > 2 and not ctx.request.model.uri:
        # no uri: a check or /v1/validate of a described model, where the name is a label and nothing is signed
        argv = [*argv[:2], "model", *argv[3:]]
    problem = model_reference_problem(argv[2]) if len(argv) > 2 else "no model argument"
    if problem:
        return [
            emit.error(
                "model_reference",
                f"{problem}; Preflight will not sign a command whose model vLLM could read as something else.",
                remedy={"uri": "a repository id, an absolute path or an s3:// URI"},
                field="model.uri",
            )
        ]
    if expected is None:
        expected = validated_arguments(ctx)
    try:
        model, parsed = _parsed_back(tuple(argv), ctx.line)
    except ArgvError as e:
        return [
            emit.error(
                "argv_roundtrip",
                f"The rendered vllm serve argv does not parse back to the validated arguments: {e}.",
                remedy=None,
                field="engine_args",
            )
        ]
    # equal dicts have no differing key under _norm either (rounding equal floats gives equal floats); the key walk
    # runs only when they differ, to name the differences
    diffs = (
        []
        if parsed == expected
        else sorted(k for k in set(expected) | set(parsed) if _norm(expected.get(k)) != _norm(parsed.get(k)))
    )
    if model != argv[2] or diffs:
        shown = ", ".join(f"{k}: validated {expected.get(k)!r}, parsed {parsed.get(k)!r}" for k in diffs[:5])
        return [
            emit.error(
                "argv_roundtrip",
                f"The rendered vllm serve argv parses back to other arguments than the ones validated ({shown}).",
                remedy=None,
                field="engine_args",
            )
        ]
    return []


def _norm(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 6)
    if isinstance(v, list):
        return [_norm(x) for x in v]
    return v
