"""A launch typed on Preflight's own command line: ``preflight check -- vllm serve MODEL …`` (behind the wrappers
entrypoints.py follows: ``-- env VLLM_X=1 vllm serve …``). Each word is placed at ``<command-line>:1:COL``, COL
counting characters as if the words were joined by single spaces."""

from __future__ import annotations

from .entrypoints import launch_start
from .found import FoundLaunch, Span, Word

COMMAND_LINE = "<command-line>"


def read_command(words: list[str]) -> FoundLaunch:
    placed: list[Word] = []
    col = 1
    for w in words:
        placed.append(Word(w, Span(COMMAND_LINE, 1, col)))
        col += len(w) + 1
    start = launch_start(words)
    if start is None:  # no server behind the wrappers: the parse says what the words are
        return FoundLaunch(kind="command", at=Span(COMMAND_LINE, 1, 1), words=placed)
    fl = FoundLaunch(kind="command", at=Span(COMMAND_LINE, 1, 1), words=[placed[k] for k in start.keep], env=start.env)
    if start.problem is not None:
        k, message = start.problem
        fl.problems.append((placed[k].at or fl.at, message))
    return fl
