"""A launch posted to the API as an argv (``"argv": ["vllm", "serve", MODEL, …]`` instead of ``engine_args``): read
exactly as the release's parser reads it (launch_argv.py), checked against the model the request names, and its
reading notes (an abbreviation, a repeated option) kept as warnings beside the rules' findings.

Every problem is a DomainError (422) naming ``argv[i]``, the element at fault. ``--config FILE`` is refused: the file
lives on the machine that runs vLLM, not on the service, and what Preflight cannot read it cannot judge.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import ValidationError

from .errors import DomainError
from .findings import Finding, Severity, verdict_of
from .launch_argv import LaunchArgvError, ReadArgv, read_launch_argv
from .request import LaunchRequest
from .versions import VersionLine, resolve_version

if TYPE_CHECKING:
    from .validate import ValidationResult

MAX_ELEMENTS = 512  # a real launch has well under 200
MAX_ELEMENT_CHARS = 2048  # a JSON value (a compilation config) fits; MAX_ELEMENTS of them stay under the body limit
MAX_TOTAL_CHARS = 65_536
NOTE_RULE = "argv_read"
NOTE_SOURCE = "vllm 0.33.0 vllm/utils/argparse_utils.py:313-513 (FlexibleArgumentParser.parse_args)"


def _at(index: int | None) -> str:
    return "argv" if index is None else f"argv[{index}]"


def read_posted_argv(argv: Sequence[str], line: VersionLine, models: Sequence[str]) -> ReadArgv:
    """``argv`` read as ``line``'s ``vllm serve`` reads it. ``models``: the names the request's model goes by (the
    manifest's name and uri); the argv's model must be one of them (empty: any). DomainError naming the element."""
    for i, word in enumerate(argv):
        if word == "--config":  # exactly the word vLLM's parser pulls a file in for (argparse_utils.py:371-372)
            raise DomainError(
                _at(i),
                f"{_at(i)}: --config names a file on the machine that runs vLLM; the service has no such file and "
                f"cannot judge what it holds: give its options in the argv",
                rule="argv_config",
            )
    try:
        read = read_launch_argv(argv, line)
    except LaunchArgvError as exc:
        raise DomainError(_at(exc.index), f"{_at(exc.index)}: {exc}", rule="argv") from None
    if models and read.model not in models:
        where = _at(read.model_index)
        raise DomainError(
            where,
            f"{where}: the argv serves {read.model!r}, another model than the request's "
            f"({' or '.join(repr(m) for m in models)})",
            rule="argv_model",
        )
    return read


def note_findings(read: ReadArgv) -> list[Finding]:
    """The reader's notes (an abbreviation, a repeated option, an ignored word) as warnings naming the element."""
    return [
        Finding(NOTE_RULE, Severity.WARNING, text, None, NOTE_SOURCE, _at(index) if index is not None else "argv")
        for index, text in read.notes
    ]


def add_notes(result: ValidationResult, read: ReadArgv | None) -> None:
    """The argv's reading notes added to ``result``'s findings after the errors, and the verdict recomputed."""
    notes = note_findings(read) if read is not None else []
    if notes:
        errors = [f for f in result.findings if f.severity is Severity.ERROR]
        rest = [f for f in result.findings if f.severity is not Severity.ERROR]
        result.findings = errors + notes + rest
        result.verdict = verdict_of(result.findings)


def request_with_argv(request: LaunchRequest, argv: Sequence[str]) -> tuple[LaunchRequest, ReadArgv]:
    """An inline launch request (``POST /v1/validate``) whose engine arguments are the argv's: its model must be
    ``model.uri`` or ``model.name`` when the request gives either, else it becomes ``model.uri``."""
    line = resolve_version(request.vllm_version)[1]
    models = tuple(m for m in (request.model.uri, request.model.name) if m)
    read = read_posted_argv(argv, line, models)
    data = request.model_dump(mode="json", exclude_unset=True)
    data.pop("argv", None)
    data["engine_args"] = read.engine_args
    if not models:
        data["model"]["uri"] = read.model
    try:
        return LaunchRequest.model_validate(data), read
    except ValidationError as e:  # a value the argv carries that the request model refuses (NaN, 1e400, depth)
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise DomainError("argv", f"argv: {where}: {first.get('msg', 'invalid')}", rule="type") from None
