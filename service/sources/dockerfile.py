"""Launches in Dockerfiles: the final stage's ENTRYPOINT and CMD combined as Docker combines them (exec form: the
CMD words appended to the ENTRYPOINT words; a shell-form ENTRYPOINT ignores CMD; shell form runs ``/bin/sh -c``),
with the ENV the image sets.

The ``vllm/vllm-openai`` image's own ENTRYPOINT is inherited when the file sets none (entrypoints.py), so a file that
only sets ``CMD ["--model", "X"]`` on that image is a launch."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from .entrypoints import IMAGE_ENTRYPOINT, is_vllm_image, launch_start, shell_script_index
from .found import FoundLaunch, SourceError, Span, Word
from .shell import _Scope, _Script
from .shellwords import Positions, ShellSyntaxError, read_commands

_INSTRUCTION = re.compile(r"[ \t]*([A-Za-z]+)[ \t]*")
_JSON_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')


@dataclass
class _Stage:
    name: str | None
    entrypoint: list[Word] | None = None  # exec form words, or None
    entry_shell: tuple[int, int] | None = None  # shell form: the text's range
    entry_at: Span | None = None
    cmd: list[Word] | None = None
    cmd_shell: tuple[int, int] | None = None
    cmd_at: Span | None = None
    env: dict[str, str] = field(default_factory=dict)
    vllm_image: bool = False


def _instructions(text: str) -> list[tuple[str, int, int, int]]:
    """(instruction, start of the instruction, start of its arguments, end) with continuation lines joined: a line
    ending in a backslash continues; comment lines inside are Docker's to drop (the shell reader skips them too)."""
    out: list[tuple[str, int, int, int]] = []
    i, n = 0, len(text)
    while i < n:
        j = text.find("\n", i)
        end = n if j < 0 else j
        line = text[i:end]
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            i = end + 1
            continue
        m = _INSTRUCTION.match(text, i, end)
        if not m:
            i = end + 1
            continue
        stop = end
        while text[i:stop].rstrip(" \t\r").endswith("\\") and stop < n:
            k = text.find("\n", stop + 1)
            stop = n if k < 0 else k
        out.append((m.group(1).upper(), i, m.end(), stop))
        i = stop + 1
    return out


def _exec_form(text: str, start: int, end: int, span_of) -> list[Word] | None:  # noqa: ANN001
    """A JSON array's strings with their places, or None when the text is no JSON array (then it is shell form)."""
    body = text[start:end]
    stripped = body.strip()
    if not stripped.startswith("["):
        return None
    i = start + body.index("[") + 1
    words: list[Word] = []

    def skip(k: int) -> int:
        while k < end:
            if text[k] in " \t\r\n":
                k += 1
            elif text.startswith("\\\n", k) or text.startswith("\\\r\n", k):
                k += 2 if text[k + 1] == "\n" else 3
            else:
                break
        return k

    i = skip(i)
    if i < end and text[i] == "]":
        return [] if not text[i + 1 : end].strip(" \t\r\n\\") else None
    while i < end:
        m = _JSON_STRING.match(text, i, end)
        if not m:
            return None
        try:
            words.append(Word(json.loads(m.group(0)), span_of(m.start())))
        except ValueError:
            return None
        i = skip(m.end())
        if i < end and text[i] == ",":
            i = skip(i + 1)
            continue
        if i < end and text[i] == "]":
            return words if not text[i + 1 : end].strip(" \t\r\n\\") else None
        return None
    return None


def read_dockerfile(text: str, file: str) -> list[FoundLaunch]:
    pos = Positions(text)

    def span_of(offset: int) -> Span:
        line, col = pos.at(offset)
        return Span(file, line, col)

    stages: dict[str, _Stage] = {}
    stage: _Stage | None = None
    args: dict[str, str | None] = {}
    for name, at, arg_start, end in _instructions(text):
        if name == "FROM":
            words = text[arg_start:end].split()
            image = next((w for w in words if not w.startswith("--")), "")
            alias = (
                words[words.index("AS") + 1]
                if "AS" in words[:-1]
                else (words[words.index("as") + 1] if "as" in words[:-1] else None)
            )
            base = stages.get(image)
            stage = _Stage(alias)
            if base is not None:  # FROM an earlier stage: its settings carry over
                stage.entrypoint, stage.entry_shell, stage.entry_at = base.entrypoint, base.entry_shell, base.entry_at
                stage.cmd, stage.cmd_shell, stage.cmd_at = base.cmd, base.cmd_shell, base.cmd_at
                stage.env, stage.vllm_image = dict(base.env), base.vllm_image
            elif is_vllm_image(image):
                stage.vllm_image = True
            if alias:
                stages[alias] = stage
            continue
        if stage is None:
            if name == "ARG":
                _arg(text, arg_start, end, args)
            continue
        if name in ("ENV", "ARG"):
            scope = _Scope({**args, **stage.env}, set(stage.env))
            script = _Script(text, file, span_of, "dockerfile")
            for cmd in read_commands(text, arg_start, end):
                pairs = [w.assignment for w in cmd.words]
                if name == "ENV" and len(cmd.words) >= 2 and pairs[0] is None:  # ENV KEY value (legacy form)
                    key = cmd.words[0].literal or ""
                    stage.env[key] = " ".join(w.literal or "" for w in cmd.words[1:])
                    continue
                for w, pair in zip(cmd.words, pairs, strict=True):
                    if pair is None:
                        if name == "ARG" and w.literal:
                            args.setdefault(w.literal, None)
                        continue
                    value = script._known(tuple(pair[1]), scope)
                    if name == "ENV" and value is not None:
                        stage.env[pair[0]] = value
                        scope.vars[pair[0]] = value
                    elif name == "ARG":
                        args[pair[0]] = value
            continue
        if name in ("ENTRYPOINT", "CMD"):
            exec_words = _exec_form(text, arg_start, end, span_of)
            shell_range = None if exec_words is not None else (arg_start, end)
            if name == "ENTRYPOINT":
                stage.entrypoint, stage.entry_shell = exec_words, shell_range
                stage.entry_at = span_of(at)
                stage.vllm_image = False
            else:
                stage.cmd, stage.cmd_shell = exec_words, shell_range
                stage.cmd_at = span_of(at)
    if stage is None:
        return []
    return _launches(text, file, stage, span_of)


def _arg(text: str, start: int, end: int, args: dict[str, str | None]) -> None:
    for word in text[start:end].split():
        key, eq, value = word.partition("=")
        args[key] = value.strip('"') if eq else args.get(key)


def _launches(text: str, file: str, stage: _Stage, span_of) -> list[FoundLaunch]:  # noqa: ANN001
    if stage.entry_shell is not None:  # shell-form ENTRYPOINT: CMD is not used
        return _shell(text, file, stage, stage.entry_shell, span_of)
    entry = stage.entrypoint
    if entry is None and stage.vllm_image:
        entry = [Word(w) for w in IMAGE_ENTRYPOINT]
    if stage.cmd_shell is not None:
        if entry:
            at = stage.cmd_at or span_of(0)
            fl = FoundLaunch(kind="dockerfile", at=at, words=[])
            fl.problems.append(
                (at, "a shell-form CMD after an exec-form ENTRYPOINT is passed as '/bin/sh -c …' arguments to it")
            )
            return [fl] if launch_start([w.text for w in entry]) else []
        return _shell(text, file, stage, stage.cmd_shell, span_of)
    words = [*(entry or []), *(stage.cmd or [])]
    script = shell_script_index([w.text for w in words])
    if script is not None:
        return _sh_c(words[script], file, stage)
    texts = [w.text for w in words]
    found = launch_start(texts, stage.env)
    if found is None:
        return []
    at = stage.entry_at if stage.entrypoint is not None else stage.cmd_at
    fl = FoundLaunch(kind="dockerfile", at=at or span_of(0), words=[words[k] for k in found.keep], env=found.env)
    if found.problem is not None:
        k, message = found.problem
        fl.problems.append((words[k].at or fl.at, message))
    return [fl]


def _shell(text: str, file: str, stage: _Stage, where: tuple[int, int], span_of) -> list[FoundLaunch]:  # noqa: ANN001
    script = _Script(text, file, span_of, "dockerfile")
    try:
        script.run(read_commands(text, *where), _Scope(dict(stage.env), set(stage.env)))
    except ShellSyntaxError as e:
        raise SourceError(str(e), span_of(e.offset)) from None
    return script.found  # each launch's env: the stage's ENV (exported to the script) as the script leaves it


def _sh_c(word: Word, file: str, stage: _Stage) -> list[FoundLaunch]:
    """``["sh", "-c", "vllm serve …"]``: the string read as a script, its words placed at the string."""
    at = word.at or Span(file, 1, 1)
    script = _Script(word.text, file, lambda _o: at, "dockerfile")
    try:
        script.run(read_commands(word.text), _Scope(dict(stage.env), set(stage.env)))
    except ShellSyntaxError as e:
        raise SourceError(str(e), at) from None
    return script.found
