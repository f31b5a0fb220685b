"""The record every reader produces (see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass, field

# a deploy file launches a handful of servers (a List of a few dozen pods at most): more than this is no deploy file,
# and each launch costs a validation, so the file is refused at the first launch over the bound
MAX_LAUNCHES = 256


def too_many_launches(at: Span) -> SourceError:
    return SourceError(f"holds more than {MAX_LAUNCHES} launches: not a deploy file (split it)", at)


@dataclass(frozen=True, slots=True)
class Span:
    """Where a word came from: the file, and the 1-based line and column of its first character."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class SourceError(ValueError):
    """A file that cannot be read as a launch (not YAML, a quote never closed, too large, binary …), located: every
    reader raises it, and ``preflight check`` reports it at ``at`` with exit status 2."""

    def __init__(self, reason: str, at: Span) -> None:
        super().__init__(f"{at}: {reason}")
        self.reason = reason
        self.at = at


@dataclass(frozen=True, slots=True)
class Word:
    """One element of the argv as the process receives it (quotes removed, variables expanded) and where it was
    written. ``at`` is None for a word the reader made up (``vllm serve`` in front of ``python -m
    vllm.entrypoints.openai.api_server``'s options, a Helm chart's own flags)."""

    text: str
    at: Span | None = None


@dataclass(slots=True)
class FoundLaunch:
    """One launch found in a file.

    ``kind``: command, shell, dockerfile, compose, kubernetes, leaderworkerset, kserve, helm, vllm-config.
    ``words``: ``vllm serve MODEL --flag value …`` or ``python3 -m vllm.entrypoints.openai.api_server …`` (both
    read by service/domain/launch_argv.py, which knows how each entry point reads its arguments; a reader may also
    rewrite other entry points to ``vllm serve``), ``--config FILE`` left in place for the parse to merge). ``env``: the variables the process gets (VLLM_*, HF_*), where the file
    sets them. ``gpu_count`` / ``gpu_product`` / ``nodes``: what the file says about the hardware
    (``resources.limits["nvidia.com/gpu"]``, a ``nvidia.com/gpu.product`` node selector, a LeaderWorkerSet's
    size), None when it says nothing. ``problems``: what the reader could not read, each located (an error);
    ``notes``: what it read but cannot check (``"$@"``), each located (a warning)."""

    kind: str
    at: Span
    words: list[Word]
    env: dict[str, str] = field(default_factory=dict)
    gpu_count: int | None = None
    gpu_product: str | None = None
    nodes: int | None = None
    name: str | None = None  # the container / service / release name, for the report
    problems: list[tuple[Span, str]] = field(default_factory=list)
    notes: list[tuple[Span, str]] = field(default_factory=list)

    @property
    def argv(self) -> list[str]:
        return [w.text for w in self.words]
