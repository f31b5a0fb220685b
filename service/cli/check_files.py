"""``preflight check``'s work: launch-request files read, validated offline and reported, with nothing but the
domain and pydantic loaded — no Typer either, so ``main()`` runs the plain form of the command (``check [--json]
FILE...``) without building the command line (CI checks files one process at a time)."""

from __future__ import annotations

import json
import os
import pathlib
import stat
from collections.abc import Callable

# A request file, config.json or safetensors index larger than this is not one (the largest real index is a few MB);
# reading at most this much bounds the time and memory a file that never ends (/dev/zero, a pipe) can take.
MAX_FILE_BYTES = 64 * 2**20


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_regular(path: pathlib.Path, mode: int) -> ValueError:
    what = next((name for test, name in _KINDS if test(mode)), "not a file")
    return ValueError(f"cannot read {path}: not a regular file ({what})")


def regular_file(path: pathlib.Path) -> bool:
    """Whether a file a model directory may hold is there: False when nothing is at ``path``, True for a regular
    file; anything else (a FIFO, a device, a directory, a symlink to one) is a ValueError naming it — never read
    as absent, which would judge an AWQ checkpoint whose quantization.txt is a FIFO as unquantized."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc.__class__.__name__}") from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st.st_mode)
    return True


def read_text(path: pathlib.Path) -> str:
    """A regular file's text, reading at most MAX_FILE_BYTES of it (opened without blocking, so a FIFO that took
    the file's place since it was looked at is refused, not waited on)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode)
        raw = f.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"the file is larger than {MAX_FILE_BYTES} bytes")
    return raw.decode("utf-8")


def read_json(path: pathlib.Path):
    return json.loads(read_text(path))


def load_request_file(path: pathlib.Path) -> dict:
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError("a launch request file must hold one JSON object")
    model = data.get("model")
    if isinstance(model, dict) and model.get("path") and model.get("config") is None:
        d = pathlib.Path(model["path"])
        if not d.is_absolute() and not d.exists():
            d = path.parent / d  # relative to the request file when not relative to the working directory
        model = {"name": str(model["path"]), **model, **read_model_dir(d)}
        pre = d / "preprocessor_config.json"  # image limits of a multimodal model (the encoder's memory profile)
        if model.get("preprocessor_config") is None and regular_file(pre):
            model["preprocessor_config"] = read_json(pre)
        model.pop("path", None)
        data = {**data, "model": model}
    return data


def read_model_dir(d: pathlib.Path) -> dict:
    """config.json (required), quantization.txt, hf_quant_config.json and the safetensors index's total_size."""
    if not regular_file(d / "config.json"):
        raise ValueError(f"{d} has no config.json")
    out: dict = {"config": read_json(d / "config.json")}
    if regular_file(d / "quantization.txt"):
        out["quantization_txt"] = read_text(d / "quantization.txt")
    if regular_file(d / "hf_quant_config.json"):
        out["hf_quant_config"] = read_json(d / "hf_quant_config.json")
    idx = d / "model.safetensors.index.json"
    if regular_file(idx):
        total = (read_json(idx).get("metadata") or {}).get("total_size")
        if isinstance(total, int):
            out["weights_bytes"] = total
    return out


def print_report(name: str, result, echo: Callable[[str], None] = print) -> None:
    r = result.as_dict()
    echo(f"== {name}: {r['verdict'].upper()}")
    for f in r["findings"]:
        echo(f"  [{f['severity']}] {f['rule']}: {f['message']}")
        if f.get("remedy"):
            echo(f"      remedy: {json.dumps(f['remedy'])}")
    b = r.get("budget")
    if b:
        echo(
            f"  budget per GPU: weights {b.get('weights_bytes_per_gpu', 0) / 2**30:.2f} GiB, "
            f"KV cache {b.get('kv_cache_bytes_per_gpu', 0) / 2**30:.2f} GiB"
        )
        if b.get("log_line"):
            echo(f"  {b['log_line']}")
    echo(f"  command: {r['command']}")


def _input_errors(exc: Exception) -> list[dict]:
    """What was wrong with a file that could not be checked, as the JSON output's ``errors``."""
    from pydantic import ValidationError

    from ..domain.errors import DomainError

    if isinstance(exc, ValidationError):
        return [{"field": ".".join(map(str, e["loc"])), "rule": e["type"], "message": e["msg"]} for e in exc.errors()]
    if isinstance(exc, DomainError):
        return [exc.as_dict()]
    return [
        {"field": "file", "rule": "unreadable" if isinstance(exc, OSError) else "invalid_json", "message": str(exc)}
    ]


def _print_invalid(path: pathlib.Path, errors: list[dict], as_json: bool, echo: Callable[[str], None]) -> None:
    if as_json:
        echo(json.dumps({"file": str(path), "verdict": "invalid", "errors": errors}))
    else:
        echo(f"== {path}: INVALID INPUT")
        for e in errors:
            echo(f"  {e.get('field', '')}: {e.get('message')}")


def check_files(
    files: list[pathlib.Path],
    as_json: bool,
    echo: Callable[[str], None] = print,
    *,
    profile=None,
    strict: bool = False,
) -> int:
    """Validate each file under the policy profile (``profile``: loaded by ``load_policy``; None: the shipped one),
    print its report (or one JSON object per line); the exit status: 0 nothing rejected, 1 a launch is rejected
    (``strict``: or warned), 2 bad input."""
    from pydantic import ValidationError

    from ..domain.errors import DomainError
    from ..domain.request import LaunchRequest
    from ..domain.validate import validate

    failing = ("reject", "warn") if strict else ("reject",)
    rejected = bad = False
    for path in files:
        try:
            req = LaunchRequest.model_validate(load_request_file(path))
            result = validate(req, policy=profile)
        except (OSError, ValueError, ValidationError, DomainError, RecursionError) as exc:
            bad = True
            if isinstance(exc, RecursionError):  # JSON nested deeper than the parser can go
                exc = ValueError("the file's JSON is nested too deeply")
            _print_invalid(path, _input_errors(exc), as_json, echo)
            continue
        rejected |= result.verdict in failing
        if as_json:
            echo(json.dumps({"file": str(path), **result.as_dict()}, separators=(",", ":")))
        else:
            print_report(str(path), result, echo)
    return 2 if bad else 1 if rejected else 0


def load_policy(path: pathlib.Path | None):
    """The policy profile ``--policy`` names, else the shipped one; ProfileError (naming the file and key)."""
    from ..domain.policy_profile import default_profile, load_profile

    return load_profile(path) if path is not None else default_profile()


def _request_report(path: pathlib.Path, profile):
    """A launch-request file as a located report (SARIF / GitHub formats): its findings at the file's start."""
    from pydantic import ValidationError

    from ..domain.errors import DomainError
    from ..domain.request import LaunchRequest
    from ..domain.validate import validate
    from ..sources.found import Span
    from .check_sources import Located, Report

    at = Span(str(path), 1, 1)
    try:
        result = validate(LaunchRequest.model_validate(load_request_file(path)), policy=profile)
    except (OSError, ValueError, ValidationError, DomainError, RecursionError) as exc:
        if isinstance(exc, RecursionError):
            exc = ValueError("the file's JSON is nested too deeply")
        errors = _input_errors(exc)
        return Report(
            at, "request", "invalid", [Located(at, "error", e.get("rule") or "invalid", e["message"]) for e in errors]
        )
    r = result.as_dict()
    found = [Located(at, f["severity"], f["rule"], f["message"]) for f in r["findings"]]
    return Report(at, "request", r["verdict"], found, None, r)


def _expanded(files, reports, codes, fmt, echo):
    """The files to check: a directory stands for the deploy files under it (sources.read.deploy_files); one that
    cannot be walked is reported like an unreadable file."""
    from ..sources.found import SourceError
    from ..sources.read import deploy_files
    from .check_sources import _invalid, emit

    for path in files:
        if not path.is_dir():
            yield path
            continue
        try:
            yield from deploy_files(path)
        except SourceError as e:
            report = _invalid(e.at, "file", "source_unreadable", f"{path} {e.reason}")
            if reports is None:
                emit([report], fmt, echo)
                codes.append(2)
            else:
                reports.append(report)


def _is_request_file(path: pathlib.Path) -> bool:
    """A .json file is a launch request unless it is a JSON object with neither ``model`` nor ``hardware`` (a
    dashboard, a JSON manifest): those are skipped as YAML files without a launch are. Unreadable JSON is judged
    (and reported) as a request."""
    try:
        data = read_json(path)
    except (OSError, ValueError, RecursionError):
        return True
    return not isinstance(data, dict) or bool({"model", "hardware"} & data.keys())


def _skipped(path: pathlib.Path):
    from ..sources.found import Span
    from .check_sources import Located, Report

    at = Span(str(path), 1, 1)
    return Report(at, "file", "skipped", [Located(at, "info", "no_launch", f"{path} is no launch request: skipped")])


def run_check(opts, echo: Callable[[str], None] = print) -> int:
    """``preflight check`` with its options (check_sources.Options): launch-request JSON files as before, deploy
    files and a ``--`` command through the source readers, all under one policy profile; the exit status of the
    worst (2 before any file for a ``--policy`` profile that cannot be used)."""
    from ..domain.policy_profile import ProfileError
    from .check_sources import Options, check_sources, emit, exit_status

    try:
        profile = load_policy(opts.policy)
    except ProfileError as exc:
        echo(f"preflight check: {exc}")
        return 2
    legacy = opts.format in ("human", "json")
    codes: list[int] = []
    reports: list = []
    for path in _expanded(opts.files, reports if not legacy else None, codes, opts.format, echo):
        if path.suffix == ".json" and not _is_request_file(path):
            if legacy:
                emit([_skipped(path)], opts.format, echo)
            else:
                reports.append(_skipped(path))
            continue
        if path.suffix == ".json":
            if legacy:
                codes.append(check_files([path], opts.format == "json", echo, profile=profile, strict=opts.strict))
            else:
                reports.append(_request_report(path, profile))
            continue
        found = check_sources(Options(files=[path], **_resolving(opts)), profile)
        if legacy:
            emit(found, opts.format, echo)
            codes.append(exit_status(found, opts.strict))
        else:
            reports += found
    if opts.command is not None:
        found = check_sources(Options(command=opts.command, **_resolving(opts)), profile)
        if legacy:
            emit(found, opts.format, echo)
            codes.append(exit_status(found, opts.strict))
        else:
            reports += found
    if not legacy:
        emit(reports, opts.format, echo)
        codes.append(exit_status(reports, opts.strict))
    if opts.format == "human":  # json carries it in every object; the reader of the human form is told once
        source = str(opts.policy) if opts.policy is not None else "shipped"
        digest = profile.digest.partition(":")[2][:12]
        echo(f"policy profile: {profile.name} ({source}, digest {digest}), environment {opts.environment}")
    return 2 if 2 in codes else 1 if 1 in codes else 0


def _resolving(opts) -> dict:
    return {k: getattr(opts, k) for k in ("gpu", "gpus", "nodes", "vllm_version", "models", "environment", "strict")}


def plain_arguments(args: list[str]):
    """check's options (check_sources.Options) when ``args`` (what follows ``check``) parse; None for anything
    else (``--help``, a usage error): the command line handles those."""
    from .check_sources import UsageError, parse_options

    try:
        return parse_options(args)
    except UsageError:
        return None
