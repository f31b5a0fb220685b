"""A launch typed on Preflight's own command line: ``preflight check -- vllm serve MODEL …``. Each word is placed
at ``<command-line>:1:COL``, COL counting characters as if the words were joined by single spaces."""

from __future__ import annotations

from .found import FoundLaunch, Span, Word

COMMAND_LINE = "<command-line>"


def read_command(words: list[str]) -> FoundLaunch:
    out: list[Word] = []
    col = 1
    for w in words:
        out.append(Word(w, Span(COMMAND_LINE, 1, col)))
        col += len(w) + 1
    return FoundLaunch(kind="command", at=Span(COMMAND_LINE, 1, 1), words=out)
