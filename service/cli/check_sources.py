"""``preflight check`` over launches where they live: deploy files (shell scripts, Dockerfiles, vLLM config YAML,
compose / Kubernetes / Helm YAML through service/sources/read.py) and a command line after ``--``, each launch
validated offline and every finding placed at the file, line and column of the word it concerns.

Command line (parsed here, without Typer, so one file costs what the plain check costs)::

    preflight check [--gpu ID] [--gpus N] [--nodes M] [--vllm-version V] [--models NAME=DIR]...
                    [--environment production|benchmark] [--policy PROFILE.toml]
                    [--format human|json|sarif|github] [--json] [--strict] FILE|DIRECTORY... [-- vllm serve MODEL ...]

Exit status: 0 nothing refused; 1 a launch refused (or warned, with --strict); 2 bad usage or input that cannot be
checked (a file that cannot be read, a launch whose model or GPU cannot be resolved, an argv vLLM would refuse)."""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..sources.found import FoundLaunch, Span

FORMATS = ("human", "json", "sarif", "github")
USAGE = (
    "usage: preflight check [--gpu ID] [--gpus N] [--nodes M] [--vllm-version V] [--models NAME=DIR] "
    "[--environment production|benchmark] [--policy PROFILE.toml] [--format human|json|sarif|github] [--strict] "
    "FILE|DIRECTORY... [-- vllm serve …]"
)


class UsageError(ValueError):
    pass


@dataclass
class Options:
    files: list[pathlib.Path] = field(default_factory=list)
    command: list[str] | None = None
    gpu: str | None = None
    gpus: int | None = None
    nodes: int | None = None
    vllm_version: str | None = None
    models: dict[str, str] = field(default_factory=dict)
    environment: str = "production"
    policy: pathlib.Path | None = None
    format: str = "human"
    strict: bool = False


_VALUED = {"--gpu", "--gpus", "--nodes", "--vllm-version", "--models", "--environment", "--policy", "--format"}


def parse_options(args: list[str]) -> Options:
    """``check``'s arguments; UsageError for anything else (``--help`` included: the command line prints it)."""
    opts = Options()
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            rest = args[i + 1 :]
            if not rest:
                raise UsageError("nothing follows '--': give the command, e.g. -- vllm serve MODEL …")
            if is_command(rest):
                opts.command = rest
            elif os.path.exists(rest[0]) and not os.path.isdir(rest[0]):
                opts.files += map(pathlib.Path, rest)  # the POSIX end of options: files follow, whatever their names
            else:
                raise UsageError(
                    "after --, expected a command: vllm serve MODEL … or python -m "
                    f"vllm.entrypoints.openai.api_server … ({rest[0]!r} is neither a command nor a file)"
                )
            break
        if a in ("--json", "--strict"):
            opts.format = "json" if a == "--json" else opts.format
            opts.strict = opts.strict or a == "--strict"
            i += 1
            continue
        name, eq, inline = a.partition("=")
        if name in _VALUED:
            if eq:
                value, i = inline, i + 1
            elif i + 1 < len(args):
                value, i = args[i + 1], i + 2
            else:
                raise UsageError(f"{name} needs a value")
            _set(opts, name, value)
            continue
        if a.startswith("-"):
            raise UsageError(f"unknown option {a!r}")
        opts.files.append(pathlib.Path(a))
        i += 1
    if not opts.files and opts.command is None:
        raise UsageError("no file and no command to check")
    return opts


def is_command(words: list[str]) -> bool:
    """Whether the words after ``--`` are a command (``vllm …``, ``python …``, behind the wrappers entrypoints.py
    follows: ``env``, ``sudo``, ``numactl`` …) rather than files."""
    from ..sources.entrypoints import is_vllm_program, server_at, unwrap

    got = unwrap(words)
    if got.problem is not None:  # a wrapper option not followed: still a command, refused at the option
        return server_at(words, got.problem[0]) is not None
    return got.index is not None and is_vllm_program(words[got.index])


def _set(opts: Options, name: str, value: str) -> None:
    if name in ("--gpus", "--nodes"):
        if not value.isdigit() or not 1 <= int(value) <= 4096:
            raise UsageError(f"{name} takes a whole number from 1, got {value!r}")
        setattr(opts, name[2:], int(value))
    elif name == "--models":
        key, eq, d = value.partition("=")
        if not eq or not key or not d:
            raise UsageError(f"--models takes NAME=DIR, got {value!r}")
        opts.models[key] = d
    elif name == "--environment":
        if value not in ("production", "benchmark"):
            raise UsageError(f"--environment is production or benchmark, got {value!r}")
        opts.environment = value
    elif name == "--format":
        if value not in FORMATS:
            raise UsageError(f"--format is one of {', '.join(FORMATS)}, got {value!r}")
        opts.format = value
    elif name == "--gpu":
        opts.gpu = value
    elif name == "--policy":
        opts.policy = pathlib.Path(value)
    else:
        opts.vllm_version = value


# ------------------------------------------------------------------------------------------------------ reports


@dataclass
class Located:
    """One finding, placed."""

    at: Span
    severity: str  # error / warning / info
    rule: str
    message: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    """One launch checked (or one input that could not be): ``verdict`` accept / warn / reject / invalid, or
    skipped for a file that holds no launch."""

    at: Span
    kind: str
    verdict: str
    findings: list[Located] = field(default_factory=list)
    name: str | None = None
    result: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "file": self.at.file,
            "line": self.at.line,
            "col": self.at.col,
            "kind": self.kind,
            "name": self.name,
            "verdict": self.verdict,
            "findings": [
                {
                    "file": f.at.file,
                    "line": f.at.line,
                    "col": f.at.col,
                    **f.data,
                    "severity": f.severity,
                    "rule": f.rule,
                    "message": f.message,
                }
                for f in self.findings
            ],
        }
        if self.result is not None:
            out["argv"] = self.result.get("argv")
            out["command"] = self.result.get("command")
            out["vllm_version"] = self.result.get("vllm_version")
            out["policy"] = self.result.get("policy")
        return out


def _invalid(at: Span, kind: str, rule: str, message: str, name: str | None = None) -> Report:
    return Report(at, kind, "invalid", [Located(at, "error", rule, message)], name)


class _Launch:
    """One FoundLaunch through the parse, the resolvers and the validator."""

    def __init__(self, found: FoundLaunch, opts: Options, profile: Any = None) -> None:
        self.found = found
        self.opts = opts
        self.profile = profile
        self.findings: list[Located] = []
        self.config_spans: dict[str, Span] = {}
        self.read: Any = None

    def word_at(self, index: int | None) -> Span:
        if index is not None and 0 <= index < len(self.found.words):
            at = self.found.words[index].at
            if at is not None:
                return at
        return self.found.at

    def field_at(self, fld: str | None) -> Span:
        """Where a finding's field was written: the option word (or the config file's key), the model word."""
        if fld and self.read is not None:
            head, _, rest = fld.partition(".")
            if head == "engine_args":
                dest = rest.split(".", 1)[0]
                key = self.read.config_keys.get(dest)
                if key is not None and key in self.config_spans:
                    return self.config_spans[key]
                if dest in self.read.origin:
                    return self.word_at(self.read.origin[dest])
            if head == "model":
                return self.model_at()
        return self.found.at

    def model_at(self) -> Span:
        if self.read is not None and self.read.model_index is not None:
            return self.word_at(self.read.model_index)
        return self.config_spans.get("model", self.found.at)

    def load_config(self, path: str) -> str:
        from ..sources.read import read_source_text
        from ..sources.vllm_config import key_spans

        base = pathlib.Path(self.found.at.file).parent if self.found.kind != "command" else pathlib.Path(".")
        p = pathlib.Path(path)
        p = p if p.is_absolute() or p.exists() else base / p
        text = read_source_text(p)
        self.config_spans = key_spans(text, str(p))
        return text

    def run(self) -> Report:
        from pydantic import ValidationError

        from ..domain.errors import DomainError
        from ..domain.launch_argv import LaunchArgvError, read_launch_argv
        from ..domain.request import LaunchRequest
        from ..domain.validate import validate
        from ..domain.versions import resolve_version
        from ..sources.read import SourceError
        from ..sources.resolve import ResolveError, resolve_hardware, resolve_model

        fl = self.found
        for at, message in fl.problems:
            self.findings.append(Located(at, "error", "source_unreadable", message))
        for at, message in fl.notes:
            self.findings.append(Located(at, "warning", "source_note", message))
        if self.findings and any(f.severity == "error" for f in self.findings):
            return Report(fl.at, fl.kind, "invalid", self.findings, fl.name)
        try:
            version, line = resolve_version(self.opts.vllm_version)
        except DomainError as e:
            return _invalid(fl.at, fl.kind, e.rule or "version_unsupported", e.message, fl.name)
        try:
            self.read = read_launch_argv(fl.argv, line, self.load_config)
        except LaunchArgvError as e:
            key_at = self.config_spans.get(e.key) if e.key is not None else None
            self.findings.append(Located(key_at or self.word_at(e.index), "error", "argv_unreadable", str(e)))
            # a word vLLM's parser would refuse: the launch is wrong (exit 1); without a word, Preflight's own bound
            verdict = "reject" if e.index is not None else "invalid"
            return Report(fl.at, fl.kind, verdict, self.findings, fl.name)
        except SourceError as e:
            self.findings.append(Located(e.at, "error", "source_unreadable", e.reason))
            return Report(fl.at, fl.kind, "invalid", self.findings, fl.name)
        for index, message in self.read.notes:
            self.findings.append(Located(self.word_at(index), "warning", "argv_note", message))
        revision = self.read.engine_args.get("revision")
        try:
            # the checker's own environment, never the file's: a deploy file that sets HF_ENDPOINT must not receive
            # the HF_TOKEN of whoever runs the check (the file's HF_* describe the node, not this machine)
            model = resolve_model(
                self.read.model,
                revision=revision if isinstance(revision, str) else None,
                models={k: pathlib.Path(v) for k, v in self.opts.models.items()},
                env=os.environ,
            )
        except ResolveError as e:
            self.findings.append(Located(self.model_at(), "error", "model_unresolved", str(e)))
            return Report(fl.at, fl.kind, "invalid", self.findings, fl.name)
        try:
            hardware = resolve_hardware(self.opts.gpu, self.opts.gpus, self.opts.nodes, fl)
        except ResolveError as e:
            self.findings.append(Located(fl.at, "error", "hardware_unresolved", str(e)))
            return Report(fl.at, fl.kind, "invalid", self.findings, fl.name)
        body = {
            "model": model,
            "hardware": hardware,
            "environment": self.opts.environment,
            "engine_args": self.read.engine_args,
            "env": {k: v for k, v in fl.env.items() if k.startswith("VLLM_")},
            "vllm_version": version,
        }
        try:
            result = validate(LaunchRequest.model_validate(body), policy=self.profile)
        except DomainError as e:
            self.findings.append(Located(self.field_at(e.field), "error", e.rule or "invalid", e.message))
            # a value vLLM refuses is a wrong launch; a GPU nobody knows is hardware this check cannot judge
            verdict = "invalid" if (e.field or "").startswith("hardware") else "reject"
            return Report(fl.at, fl.kind, verdict, self.findings, fl.name)
        except ValidationError as e:
            for err in e.errors():
                fld = ".".join(map(str, err["loc"]))
                self.findings.append(Located(self.field_at(fld), "error", err["type"], f"{fld}: {err['msg']}"))
            return Report(fl.at, fl.kind, "invalid", self.findings, fl.name)
        r = result.as_dict()
        for f, d in zip(result.findings, r["findings"], strict=True):
            extra = {k: d[k] for k in ("remedy", "source", "field") if d.get(k)}
            self.findings.append(Located(self.field_at(f.field), f.severity.value, f.rule, f.message, extra))
        return Report(fl.at, fl.kind, r["verdict"], self.findings, fl.name, r)


def check_sources(opts: Options, profile: Any = None) -> list[Report]:
    """Every launch of every input, checked under the policy ``profile`` (None: the shipped one; JSON request files
    are check_files' and not here)."""
    from ..sources.command import read_command
    from ..sources.read import SourceError, read_launches

    reports: list[Report] = []
    for path in opts.files:
        try:
            found = read_launches(path)
        except SourceError as e:
            reports.append(_invalid(e.at, "file", "source_unreadable", f"{path} {e.reason}"))
            continue
        if not found:  # nothing to check (a pre-commit hook hands over every YAML file): said, and not a failure
            at = Span(str(path), 1, 1)
            note = Located(at, "info", "no_launch", f"{path} starts no vLLM server: nothing to check")
            reports.append(Report(at, "file", "skipped", [note]))
        reports += [_Launch(fl, opts, profile).run() for fl in found]
    if opts.command is not None:
        reports.append(_Launch(read_command(opts.command), opts, profile).run())
    for r in reports:
        r.findings = collapse(r.findings)
    return reports


def collapse(findings: list[Located]) -> list[Located]:
    """Findings that say the same thing (the same severity, rule and message: 1,500 command substitutions on one line)
    as one, placed at the first, with how many there were (``count``)."""
    first: dict[tuple[str, str, str], Located] = {}
    counts: dict[tuple[str, str, str], int] = {}
    for f in findings:
        key = (f.severity, f.rule, f.message)
        first.setdefault(key, f)
        counts[key] = counts.get(key, 0) + 1
    out = []
    for key, f in first.items():
        n = counts[key]
        if n > 1:
            f = Located(
                f.at, f.severity, f.rule, f"{f.message} ({n} times; the first is placed)", {**f.data, "count": n}
            )
        out.append(f)
    return out


def exit_status(reports: list[Report], strict: bool) -> int:
    if any(r.verdict == "invalid" for r in reports):
        return 2
    if any(r.verdict == "reject" for r in reports):
        return 1
    if strict and any(f.severity == "warning" for r in reports for f in r.findings):
        return 1
    return 0


# ------------------------------------------------------------------------------------------------------ formats


def human(reports: list[Report], echo: Callable[[str], None]) -> None:
    for r in reports:
        label = f" ({r.kind}{': ' + r.name if r.name else ''})" if r.kind not in ("file",) else ""
        echo(f"== {r.at}{label}: {r.verdict.upper()}")
        for f in r.findings:
            echo(f"{f.at}: {f.severity} {f.rule}: {f.message}")
        if r.result and r.result.get("command"):
            echo(f"  command: {r.result['command']}")


def json_lines(reports: list[Report], echo: Callable[[str], None]) -> None:
    for r in reports:
        echo(json.dumps(r.as_dict(), separators=(",", ":")))


_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"


def sarif(reports: list[Report]) -> dict[str, Any]:
    """SARIF 2.1.0: one run, a rule per rule id seen, a result per finding (``<command-line>`` has no file)."""
    rules: dict[str, dict[str, Any]] = {}
    results = []
    for r in reports:
        for f in r.findings:
            rules.setdefault(f.rule, {"id": f.rule, "name": f.rule})
            res: dict[str, Any] = {
                "ruleId": f.rule,
                "level": _SARIF_LEVEL.get(f.severity, "note"),
                "message": {"text": f.message},
            }
            if not f.at.file.startswith("<"):
                res["locations"] = [
                    {
                        "physicalLocation": {
                            "artifactLocation": {"uri": pathlib.Path(f.at.file).as_posix()},
                            "region": {"startLine": f.at.line, "startColumn": f.at.col},
                        }
                    }
                ]
            results.append(res)
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "preflight", "rules": list(rules.values())}},
                "results": results,
            }
        ],
    }


def _gh_data(text: str) -> str:
    """GitHub workflow command data: % \\r \\n escaped (actions/toolkit packages/core/src/command.ts escapeData)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_property(text: str) -> str:
    """A property value: also : and , (command.ts escapeProperty)."""
    return _gh_data(text).replace(":", "%3A").replace(",", "%2C")


def github(reports: list[Report], echo: Callable[[str], None]) -> None:
    kinds = {"error": "error", "warning": "warning", "info": "notice"}
    for r in reports:
        for f in r.findings:
            props = (
                []
                if f.at.file.startswith("<")
                else [f"file={_gh_property(f.at.file)}", f"line={f.at.line}", f"col={f.at.col}"]
            )
            props.append(f"title={_gh_property(f.rule)}")
            echo(f"::{kinds.get(f.severity, 'notice')} {','.join(props)}::{_gh_data(f.message)}")


def emit(reports: list[Report], fmt: str, echo: Callable[[str], None]) -> None:
    if fmt == "json":
        json_lines(reports, echo)
    elif fmt == "sarif":
        echo(json.dumps(sarif(reports), indent=2))
    elif fmt == "github":
        github(reports, echo)
    else:
        human(reports, echo)
