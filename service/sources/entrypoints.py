"""Which argv starts vLLM's server: the one place every reader (shell scripts, Dockerfiles, compose, Kubernetes,
KServe) asks.

- ``vllm serve …`` (any path to ``vllm``), ``python -m vllm.entrypoints.openai.api_server …`` and ``python -m
  vllm.entrypoints.cli.main serve …`` (python's own options, such as ``-u``, dropped): the words are kept as written,
  and service/domain/launch_argv.py reads each entry point as vLLM does.
- ``sh -c SCRIPT`` (``-c`` alone or among combined options: ``-lc``, ``-ec``): the script is read as a shell script.
- The ``vllm/vllm-openai`` image without a command of its own runs its ENTRYPOINT: ``vllm serve`` in current
  releases (vLLM docker/Dockerfile, the ``vllm-openai`` stage), ``python3 -m vllm.entrypoints.openai.api_server`` in
  older ones (vllm-project/vllm 0000977e docker/Dockerfile, last line); both read ``--model X`` alike, so arguments
  given to the image are read as ``vllm serve`` + arguments."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence

from ..domain.launch_argv import API_SERVER_MODULE, CLI_MODULE, PYTHON_PROGRAM

VLLM_IMAGE = re.compile(
    r"(?:(?:docker\.io|registry-1\.docker\.io|registry\.hub\.docker\.com|public\.ecr\.aws/[^/\s]+)/)?"
    r"vllm/vllm-openai(?:-[a-z0-9]+)?(?::[^@\s]+)?(?:@\S+)?"
)
IMAGE_ENTRYPOINT = ("vllm", "serve")
SHELLS = {"sh", "bash", "dash", "ash", "zsh", "ksh"}
# programs that run the rest of the line (their own options skipped): the server is the command behind them
WRAPPERS = {"exec", "nohup", "command", "setsid", "time", "builtin"}
_PY_OPTS_WITH_VALUE = {"-X", "-W"}
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)


def is_vllm_image(image: str | None) -> bool:
    return bool(image and VLLM_IMAGE.fullmatch(image.strip()))


def is_vllm_program(word: str | None) -> bool:
    """``vllm`` or a Python interpreter (any path): the programs a launch of vLLM's server starts with."""
    prog = posixpath.basename(word or "")
    return prog == "vllm" or PYTHON_PROGRAM.fullmatch(prog) is not None


def program_index(words: Sequence[str]) -> tuple[int, dict[str, str]]:
    """Where the program of an exec-form argv is, behind ``exec`` / ``nohup`` / ``env VAR=x``, and the variables
    ``env`` sets."""
    env: dict[str, str] = {}
    i = 0
    while i < len(words):
        if words[i] in WRAPPERS:
            i += 1
        elif words[i] == "env":
            i += 1
            while i < len(words) and _ASSIGNMENT.fullmatch(words[i]):
                name, _, value = words[i].partition("=")
                env[name] = value
                i += 1
        else:
            break
    return i, env


def server_words(words: Sequence[str | None]) -> list[int] | None:
    """For a command whose program is ``words[0]`` (None: a word not known here): the indexes of the words the
    launch keeps when it starts vLLM's server, else None."""
    if not words or words[0] is None:
        return None
    if not is_vllm_program(words[0]):
        return None
    if posixpath.basename(words[0]) == "vllm":
        return list(range(len(words))) if words[1:2] == ["serve"] else None
    j = 1
    while j < len(words) and (words[j] or "").startswith("-") and words[j] != "-m":
        j += 2 if words[j] in _PY_OPTS_WITH_VALUE else 1
    if j + 1 >= len(words) or words[j] != "-m":
        return None
    module = words[j + 1]
    if module == API_SERVER_MODULE or (module == CLI_MODULE and words[j + 2 : j + 3] == ["serve"]):
        return [0, *range(j, len(words))]
    return None


def shell_script_index(words: Sequence[str | None]) -> int | None:
    """The index of SCRIPT in ``sh [-e …] -c SCRIPT`` (``-c`` alone or combined: ``-lc``, ``-ec``), else None."""
    if not words or words[0] is None or posixpath.basename(words[0]) not in SHELLS:
        return None
    for k in range(1, len(words)):
        w = words[k] or ""
        if not w.startswith("-") or w.startswith("--"):
            return None
        if "c" in w[1:]:
            return k + 1 if k + 1 < len(words) else None
    return None


def launch_start(words: Sequence[str]) -> tuple[list[int], dict[str, str]] | None:
    """For an exec-form argv (no shell: a Dockerfile's or a container's): the indexes of the launch's words when it
    starts vLLM's server behind ``exec`` / ``nohup`` / ``env VAR=x``, and the variables ``env`` sets; else None."""
    i, env = program_index(words)
    keep = server_words(words[i:])
    return ([i + k for k in keep], env) if keep is not None else None
