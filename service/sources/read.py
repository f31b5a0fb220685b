"""``read_launches(path)``: a deploy file's launches, by the file's kind.

Dispatch: ``READERS`` is a list of (claims(path, text), read(path, text)) pairs tried in order; the first that
claims the file reads it. The YAML kinds live in their own modules, imported only for a YAML file (the JSON path
never loads ruamel.yaml): each of ``YAML_KINDS`` — kube.py (Kubernetes workloads, LeaderWorkerSet, and KServe
through kserve.py), compose.py, helm.py (production-stack values) — defines ``claims(path, text) -> bool`` (the
file's top-level keys, read on the text) and ``read(path, text) -> list[FoundLaunch]``. vLLM's own config YAML is
the last YAML kind tried. Every reader raises ``SourceError`` (found.py), located, for a file it cannot read."""

from __future__ import annotations

import importlib
import os
import pathlib
import re
import stat
from collections.abc import Callable

from .entrypoints import COMMENT_LINE, SERVER_NAMED
from .found import MAX_LAUNCHES, FoundLaunch, SourceError, Span, too_many_launches

MAX_SOURCE_BYTES = 1 << 20  # a deploy file larger than 1 MiB is not one; bounded work whatever the path holds
YAML_SUFFIXES = (".yaml", ".yml")
SHELL_SUFFIXES = (".sh", ".bash")
YAML_KINDS = ("kube", "compose", "helm")  # modules of this package, tried in this order

Claims = Callable[[pathlib.Path, str], bool]
Reader = Callable[[pathlib.Path, str], list[FoundLaunch]]

__all__ = ["SourceError", "read_launches", "read_source_text"]


def read_source_text(path: pathlib.Path, limit: int = MAX_SOURCE_BYTES) -> str:
    """A deploy file's text: at most ``limit`` bytes, UTF-8 (a BOM dropped), no NUL (a binary file is refused,
    naming the file and the line of the first bad byte)."""
    at = Span(str(path), 1, 1)
    try:
        # O_NONBLOCK and a regular file only: a FIFO or a device handed over as a deploy file must not hang the check
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise SourceError("is not a regular file", at)
            raw = f.read(limit + 1)
    except OSError as e:
        raise SourceError(f"cannot be read: {e.strerror or e}", at) from None
    if len(raw) > limit:
        raise SourceError(f"is larger than {limit} bytes: not a deploy file", at)
    if b"\x00" in raw:
        line = raw[: raw.index(b"\x00")].count(b"\n") + 1
        raise SourceError("is a binary file (it holds NUL bytes)", Span(str(path), line, 1))
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise SourceError(f"is not UTF-8 text (byte {e.start})", Span(str(path), line, 1)) from None


MAX_WALKED_FILES = 10_000  # a deploy repository holds hundreds; a walk that finds more is bounded, not endless
SKIPPED_DIRS = frozenset({"node_modules", "venv", "__pycache__"})


def deploy_files(directory: pathlib.Path) -> list[pathlib.Path]:
    """The files under ``directory`` that ``preflight check`` reads, in name order: launch-request ``.json``, YAML,
    Dockerfiles, shell scripts by suffix or ``#!`` line. Hidden directories (``.git``), ``node_modules`` and
    virtual environments are not entered, symbolic links not followed; more than MAX_WALKED_FILES candidates is a
    SourceError."""
    found: list[pathlib.Path] = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS and not d.endswith("venv"))
        for name in sorted(files):
            path = pathlib.Path(root) / name
            if path.is_symlink() or not _checkable(path):
                continue
            found.append(path)
            if len(found) > MAX_WALKED_FILES:
                raise SourceError(f"holds more than {MAX_WALKED_FILES} files to check", Span(str(directory), 1, 1))
    return found


def _checkable(path: pathlib.Path) -> bool:
    if path.suffix == ".json" or is_yaml(path) or is_dockerfile(path) or path.suffix in SHELL_SUFFIXES:
        return True
    if path.suffix:
        return False
    try:  # an extensionless script: its #! line (a regular file only, read without blocking)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            return stat.S_ISREG(os.fstat(f.fileno()).st_mode) and f.read(2) == b"#!"
    except OSError:
        return False


def is_dockerfile(path: pathlib.Path, _text: str = "") -> bool:
    name = path.name
    return (
        name in ("Dockerfile", "Containerfile")
        or name.startswith(("Dockerfile.", "Containerfile."))
        or (name.endswith((".dockerfile", ".Dockerfile")))
    )


def is_shell(path: pathlib.Path, text: str) -> bool:
    if path.suffix in SHELL_SUFFIXES:
        return True
    first = text.split("\n", 1)[0]
    return first.startswith("#!") and any(s in first for s in ("sh", "bash"))


def is_yaml(path: pathlib.Path, _text: str = "") -> bool:
    return path.suffix in YAML_SUFFIXES


def _read_dockerfile(path: pathlib.Path, text: str) -> list[FoundLaunch]:
    from .dockerfile import read_dockerfile

    return read_dockerfile(text, str(path))


def _read_shell(path: pathlib.Path, text: str) -> list[FoundLaunch]:
    from .shell import read_script

    return read_script(text, str(path))


def _read_yaml(path: pathlib.Path, text: str) -> list[FoundLaunch]:
    for name in YAML_KINDS:
        kind = importlib.import_module(f"{__package__}.{name}")
        if kind.claims(path, text):
            found: list[FoundLaunch] = kind.read(path, text)
            return found
    return _read_vllm_config(path, text)


def _read_vllm_config(path: pathlib.Path, text: str) -> list[FoundLaunch]:
    import yaml

    from ..domain.launch_argv import load_config_yaml
    from .vllm_config import looks_like_vllm_config, read_vllm_config

    try:
        data = load_config_yaml(text)
    except (yaml.YAMLError, RecursionError, ValueError) as e:
        mark = getattr(e, "problem_mark", None)
        at = Span(str(path), mark.line + 1, mark.column + 1) if mark else Span(str(path), 1, 1)
        raise SourceError(f"is not YAML: {getattr(e, 'problem', None) or e}", at) from None
    if not looks_like_vllm_config(data):
        return []
    return [read_vllm_config(text, str(path), str(path))]


READERS: list[tuple[Claims, Reader]] = [
    (is_dockerfile, _read_dockerfile),
    (is_yaml, _read_yaml),
    (is_shell, _read_shell),
]


# what every launch a YAML reader finds carries somewhere in the file: vLLM's name (the command, the entry point
# module, the image), the production-stack chart's key, a KServe kind (its Hugging Face server runs vLLM), or the
# ``model:`` key of vLLM's own config YAML
LAUNCH_MARK = re.compile(r"vllm|servingEngineSpec|InferenceService|ServingRuntime|^model\s*:", re.IGNORECASE | re.M)


def read_launches(path: pathlib.Path) -> list[FoundLaunch]:
    """The launches ``path`` holds (none: a file of a known kind that starts no vLLM server). Raises SourceError for
    a file it cannot read, or of no kind it knows."""
    text = read_source_text(path)
    if path.suffix.lower() in (".yaml", ".yml") and not LAUNCH_MARK.search(text):
        return []  # no vLLM word, image, chart key or KServe kind: no launch can be in it (CI workflows, mkdocs.yml)
    for claims, read in READERS:
        if claims(path, text):
            found = read(path, text)
            if len(found) > MAX_LAUNCHES:
                raise too_many_launches(found[MAX_LAUNCHES].at)
            # said (outside comment lines), yet no launch read: fails closed
            said = COMMENT_LINE.sub("", text)  # comment lines emptied: the line numbers stay
            named = None if found else SERVER_NAMED.search(said)
            if named is not None:
                raise SourceError(
                    "names vLLM's server (vllm serve / vllm.entrypoints) but no launch could be read from it (in a "
                    "string, a function, an sh -c nested deeper than the reader follows?): check the command itself "
                    "with preflight check -- vllm serve …",
                    Span(str(path), said[: named.start()].count("\n") + 1, 1),
                )
            return found
    raise SourceError(
        "is of no kind preflight check reads (a launch-request .json, a shell script, a Dockerfile, vLLM config "
        "YAML, compose / Kubernetes / Helm YAML)",
        Span(str(path), 1, 1),
    )
