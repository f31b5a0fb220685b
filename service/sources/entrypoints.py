"""Which argv starts vLLM's server: the one place every reader (shell scripts, Dockerfiles, compose, Kubernetes,
KServe) asks.

- ``vllm serve …`` (any path to ``vllm``), ``python -m vllm.entrypoints.openai.api_server …`` and ``python -m
  vllm.entrypoints.cli.main serve …`` (python's own options, such as ``-u``, dropped): the words are kept as written,
  and service/domain/launch_argv.py reads each entry point as vLLM does.
- ``sh -c SCRIPT`` (``-c`` alone or among combined options: ``-lc``, ``-ec``): the script is read as a shell script.
- Wrapper programs that run the rest of their line (``WRAPPERS``: exec, command, time, nohup, env, timeout, nice,
  stdbuf, setsid, taskset, chrt, numactl, sudo, ``uv run``) are followed as they run it: each reads its own options
  as its source does (cited per wrapper), then runs the command behind them; what it does to the environment
  (``env -i`` / ``-u`` / ``NAME=VALUE``, ``sudo``'s reset unless ``-E``, ``exec -c``) is kept. An option a wrapper
  does not have here, or whose effect is not followed (``env -S``, ``uv run -m``), is a located problem.
- The ``vllm/vllm-openai`` image without a command of its own runs its ENTRYPOINT: ``vllm serve`` in current
  releases (vLLM docker/Dockerfile, the ``vllm-openai`` stage), ``python3 -m vllm.entrypoints.openai.api_server`` in
  older ones (vllm-project/vllm 0000977e docker/Dockerfile, last line); both read ``--model X`` alike, so arguments
  given to the image are read as ``vllm serve`` + arguments."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from ..domain.launch_argv import API_SERVER_MODULE, CLI_MODULE, PYTHON_PROGRAM

VLLM_IMAGE = re.compile(
    r"(?:(?:docker\.io|registry-1\.docker\.io|registry\.hub\.docker\.com|public\.ecr\.aws/[^/\s]+)/)?"
    r"vllm/vllm-openai(?:-[a-z0-9]+)?(?::[^@\s]+)?(?:@\S+)?"
)
IMAGE_ENTRYPOINT = ("vllm", "serve")
# text that names vLLM's server: a file or command saying it and yielding no launch fails closed
# vLLM's server named in a file: as shell words (vllm serve), as exec-form list items ("vllm", "serve" in JSON or
# YAML, quoted either way), or by its entry-point modules
SERVER_NAMED = re.compile(
    r"""vllm["']?(\s|,)*["']?serve\b|vllm\.entrypoints\.openai\.api_server|vllm\.entrypoints\.cli\.main"""
)
COMMENT_LINE = re.compile(r"(?m)^[ \t]*#.*$")
SHELLS = {"sh", "bash", "dash", "ash", "zsh", "ksh"}
_PY_OPTS_WITH_VALUE = {"-X", "-W"}
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)


def is_vllm_image(image: str | None) -> bool:
    return bool(image and VLLM_IMAGE.fullmatch(image.strip()))


def is_vllm_program(word: str | None) -> bool:
    """``vllm`` or a Python interpreter (any path): the programs a launch of vLLM's server starts with."""
    prog = posixpath.basename(word or "")
    return prog == "vllm" or PYTHON_PROGRAM.fullmatch(prog) is not None


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


# ------------------------------------------------------------------------------------------------------ wrappers


@dataclass(frozen=True, slots=True)
class Wrapper:
    """A program that runs the rest of its line as a command, and how it reads its own arguments first: getopt_long
    with a leading '+' (options stop at the first operand, ``--`` ends them, a long option may be a unique prefix)
    unless said otherwise.

    ``short``: the getopt short-option string (a letter, ``:`` after one that takes a value, ``::`` for one whose
    value is attached or absent); ``long``: name → (0 no value / 1 a value / 2 an optional ``=value``, the short
    letter it stands for or the name); ``operands``: words the wrapper takes before the command (``timeout``'s
    DURATION); ``digits_operand``: one operand, taken only when it is all digits (``chrt``'s priority);
    ``assignments``: ``NAME=VALUE`` words before the command set variables; ``no_command``: options after which no
    command runs (``--help``, ``taskset -p``); ``not_followed``: options whose effect this reader does not follow
    (a located problem); ``subcommand``: the word after the program (``uv run``)."""

    source: str
    short: str = ""
    long: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    operands: int = 0
    digits_operand: bool = False
    assignments: bool = False
    no_command: frozenset[str] = frozenset()
    not_followed: Mapping[str, str] = field(default_factory=dict)
    subcommand: str | None = None
    abbrev: bool = True
    numeric_option: bool = False  # ``nice -10``: a '-' and digits is the adjustment (coreutils src/nice.c:118-123)


def _gnu(**names: int | tuple[int, str]) -> dict[str, tuple[int, str]]:
    """Long options: ``name_with_underscores=has_arg`` (the option stands for itself) or ``(has_arg, letter)``."""
    out: dict[str, tuple[int, str]] = {}
    for key, spec in names.items():
        name = key.replace("_", "-")
        out[name] = spec if isinstance(spec, tuple) else (spec, name)
    out.setdefault("help", (0, "help"))
    out.setdefault("version", (0, "version"))
    return out


_INFO = frozenset({"help", "version"})
# uv run's options (uv 0.13.9 ``uv run --help``; clap: no abbreviations, a value as the next word or after '=')
_UV_VALUED = (
    "extra no-extra group no-group only-group no-editable-package env-file with with-editable with-requirements package "
    "python-platform index default-index index-url extra-index-url find-links index-strategy keyring-provider "
    "upgrade-package upgrade-group resolution prerelease prerelease-package fork-strategy exclude-newer "
    "exclude-newer-package no-sources-package reinstall-package link-mode config-setting config-settings-package "
    "no-build-isolation-package no-build-package no-binary-package cache-dir refresh-package python color "
    "allow-insecure-host directory project config-file"
).split()
_UV_FLAGS = (
    "all-extras no-dev only-dev no-default-groups all-groups module no-editable exact no-env-file isolated active "
    "no-sync locked frozen script gui-script all-packages no-project no-index upgrade no-sources reinstall "
    "compile-bytecode no-build-isolation no-build no-binary require-build-hashes no-require-build-hashes no-cache "
    "refresh managed-python no-managed-python no-python-downloads quiet verbose system-certs offline no-progress "
    "no-config help"
).split()
_UV_SHORT = {
    "w": "with",
    "i": "index-url",
    "f": "find-links",
    "P": "upgrade-package",
    "C": "config-setting",
    "p": "python",
    "m": "module",
    "s": "script",
    "U": "upgrade",
    "n": "no-cache",
    "q": "quiet",
    "v": "verbose",
    "h": "help",
}

WRAPPERS: dict[str, Wrapper] = {
    # shell builtins (bash 5.2 builtins/exec.def, command.def; the `time` keyword: parse.y time_command_acceptable)
    "exec": Wrapper("bash builtins/exec.def: exec [-cl] [-a name]", "cla:", abbrev=False),
    "command": Wrapper("bash builtins/command.def: command [-pVv]", "pVv", no_command=frozenset("Vv"), abbrev=False),
    "builtin": Wrapper("bash builtins/builtin.def", abbrev=False),
    "time": Wrapper("bash parse.y: time [-p]", "p", abbrev=False),
    # coreutils 9.11
    "nohup": Wrapper("coreutils src/nohup.c", long=_gnu(), no_command=_INFO),
    "env": Wrapper(
        "coreutils src/env.c:98-128",
        "+a:C:iS:u:v0",
        _gnu(
            argv0=(1, "a"),
            ignore_environment=(0, "i"),
            env0_from=1,
            null=(0, "0"),
            unset=(1, "u"),
            chdir=(1, "C"),
            default_signal=2,
            ignore_signal=2,
            block_signal=2,
            list_signal_handling=0,
            debug=(0, "v"),
            split_string=(1, "S"),
        ),
        assignments=True,
        no_command=_INFO | {"list-signal-handling"},
        not_followed={
            "S": "env -S splits its string into words",
            "env0-from": "env --env0-from reads variables from a file",
        },
    ),
    "timeout": Wrapper(
        "coreutils src/timeout.c:97-107,522",
        "+fk:ps:v",
        _gnu(foreground=(0, "f"), kill_after=(1, "k"), preserve_status=(0, "p"), signal=(1, "s"), verbose=(0, "v")),
        operands=1,
        no_command=_INFO,
    ),
    "nice": Wrapper(
        "coreutils src/nice.c:118-160", "+n:", _gnu(adjustment=(1, "n")), no_command=_INFO, numeric_option=True
    ),
    "stdbuf": Wrapper(
        "coreutils src/stdbuf.c:323", "+i:o:e:", _gnu(input=(1, "i"), output=(1, "o"), error=(1, "e")), no_command=_INFO
    ),
    # util-linux 2.43
    "setsid": Wrapper(
        "util-linux sys-utils/setsid.c:59-73",
        "+Vhcfw",
        _gnu(ctty=(0, "c"), fork=(0, "f"), wait=(0, "w"), help=(0, "h"), version=(0, "V")),
        no_command=frozenset("hV"),
    ),
    "taskset": Wrapper(
        "util-linux schedutils/taskset.c:167-183",
        "+apchV",
        _gnu(all_tasks=(0, "a"), pid=(0, "p"), cpu_list=(0, "c"), help=(0, "h"), version=(0, "V")),
        operands=1,
        no_command=frozenset("phV"),
    ),
    "chrt": Wrapper(
        "util-linux schedutils/chrt.c:450-480,600-606",
        "+abdD:efiphmoOP:T:rRU:X:GvV",
        _gnu(
            all_tasks=(0, "a"),
            batch=(0, "b"),
            clamp_min=(1, "U"),
            clamp_max=(1, "X"),
            deadline=(0, "d"),
            deadline_overrun=(0, "O"),
            ext=(0, "e"),
            fifo=(0, "f"),
            idle=(0, "i"),
            pid=(0, "p"),
            help=(0, "h"),
            max=(0, "m"),
            other=(0, "o"),
            rr=(0, "r"),
            sched_runtime=(1, "T"),
            sched_period=(1, "P"),
            sched_deadline=(1, "D"),
            reset_on_fork=(0, "R"),
            reclaim_grub=(0, "G"),
            verbose=(0, "v"),
            version=(0, "V"),
        ),
        digits_operand=True,
        no_command=frozenset("phmV"),
    ),
    # numactl 2.0.19 numactl.c:44-73 (short options built from the table: get_short_opts)
    "numactl": Wrapper(
        "numactl numactl.c:44-73",
        "+ai:w:p:P:c:N:C:m:slbHS:f:o:L:tM:dDI:uTV",
        _gnu(
            all=(0, "a"),
            interleave=(1, "i"),
            weighted_interleave=(1, "w"),
            preferred=(1, "p"),
            preferred_many=(1, "P"),
            cpubind=(1, "c"),
            cpunodebind=(1, "N"),
            physcpubind=(1, "C"),
            membind=(1, "m"),
            show=(0, "s"),
            localalloc=(0, "l"),
            balancing=(0, "b"),
            hardware=(0, "H"),
            shm=(1, "S"),
            file=(1, "f"),
            offset=(1, "o"),
            length=(1, "L"),
            strict=(0, "t"),
            shmmode=(1, "M"),
            dump=(0, "d"),
            dump_nodes=(0, "D"),
            shmid=(1, "I"),
            huge=(0, "u"),
            touch=(0, "T"),
            cpu_compress=0,
            verify=(0, "V"),
        ),
        no_command=frozenset({"s", "H", "S", "f", "version"}),
    ),
    # sudo 1.9 src/parse_args.c:110-147; NAME=VALUE after the options set variables
    "sudo": Wrapper(
        "sudo src/parse_args.c:110-147",
        "+Aa:BbC:c:D:Eeg:Hh::iKklNnPp:R:r:SsT:t:U:u:Vv",
        _gnu(
            background=(0, "b"),
            preserve_env=(2, "E"),
            edit=(0, "e"),
            set_home=(0, "H"),
            login=(0, "i"),
            remove_timestamp=(0, "K"),
            list=(0, "l"),
            preserve_groups=(0, "P"),
            shell=(0, "s"),
            other_user=(1, "U"),
            validate=(0, "v"),
            askpass=(0, "A"),
            auth_type=(1, "a"),
            bell=(0, "B"),
            close_from=(1, "C"),
            login_class=(1, "c"),
            chdir=(1, "D"),
            group=(1, "g"),
            help=(0, "h"),
            host=1,
            reset_timestamp=(0, "k"),
            no_update=(0, "N"),
            non_interactive=(0, "n"),
            prompt=(1, "p"),
            chroot=(1, "R"),
            role=(1, "r"),
            stdin=(0, "S"),
            command_timeout=(1, "T"),
            type=(1, "t"),
            user=(1, "u"),
            version=(0, "V"),
        ),
        assignments=True,
        no_command=frozenset("hKlveV"),
    ),
    "uv": Wrapper(
        "uv 0.13.9 `uv run --help`",
        "+" + "".join(k + (":" if v in _UV_VALUED else "") for k, v in _UV_SHORT.items()),
        {
            **{n: (1, n) for n in _UV_VALUED},
            **{n: (0, n) for n in _UV_FLAGS},
            **{v: (0 if v in _UV_FLAGS else 1, k) for k, v in _UV_SHORT.items()},
        },
        no_command=frozenset("h"),
        not_followed={
            "m": "uv run -m runs a module",
            "s": "uv run --script runs a script file",
            "gui-script": "uv run --gui-script runs a script file",
        },
        subcommand="run",
        abbrev=False,
    ),
}


@dataclass(frozen=True, slots=True)
class EnvOp:
    """What a wrapper does to the environment of the command behind it: ``set`` NAME from the ``NAME=VALUE`` word at
    ``index``, ``unset`` NAME, ``clear`` all, ``keep`` only ``names``."""

    kind: str
    name: str = ""
    index: int = -1
    names: frozenset[str] = frozenset()


@dataclass(slots=True)
class Unwrapped:
    """The command behind the wrappers: its first word's ``index`` (None: the words run no command), the wrappers'
    effects on the environment in order, and a located ``problem`` (word index, message) for wrapper arguments this
    reader cannot follow."""

    index: int | None
    env: list[EnvOp] = field(default_factory=list)
    problem: tuple[int, str] | None = None


_LONG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
V = TypeVar("V")


def _assigned(word: str | None) -> str | None:
    return word.partition("=")[0] if word is not None and _ASSIGNMENT.fullmatch(word) else None


def _shorts(spec: str) -> dict[str, int]:
    """getopt's short-option string: letter → 0 (a flag), 1 (takes a value), 2 (an attached value or none)."""
    out: dict[str, int] = {}
    s = spec.lstrip("+")
    k = 0
    while k < len(s):
        colons = len(s[k + 1 :]) - len(s[k + 1 :].lstrip(":"))
        out[s[k]] = min(colons, 2)
        k += 1 + colons
    return out


def _long(spec: Wrapper, name: str) -> str | list[str]:
    """The long option ``name`` is (a unique prefix too, where getopt_long allows it); the candidates otherwise."""
    if name in spec.long:
        return name
    if not spec.abbrev:
        return []
    matches = [n for n in spec.long if n.startswith(name)]
    return matches[0] if len(matches) == 1 else matches


def _options(
    prog: str, spec: Wrapper, words: Sequence[str | None], j: int
) -> tuple[int, list[tuple[str, str | None, int]], tuple[int, str] | None]:
    """The wrapper's own options from ``words[j]``: (where its operands begin, [(option, value, word index)],
    problem)."""
    seen: list[tuple[str, str | None, int]] = []
    shorts = _shorts(spec.short)
    while j < len(words):
        w = words[j]
        if w is None:
            return j, seen, (j, f"a word not known here stands where {prog}'s options or command are")
        if w == "--":
            return j + 1, seen, None
        if spec.numeric_option and re.fullmatch(r"-[-+]?\d+", w):
            seen.append(("n", w[1:], j))
            j += 1
            continue
        if not w.startswith("-") or w == "-":
            return j, seen, None
        if w.startswith("--"):
            name, eq, value = w[2:].partition("=")
            found = _long(spec, name)
            if not isinstance(found, str):
                which = f" (it could be --{', --'.join(found[:5])})" if found else ""
                return j, seen, (j, f"{w.split('=')[0]} is not an option of {prog} known here{which} ({spec.source})")
            has, key = spec.long[found]
            if has == 0 and eq:
                return j, seen, (j, f"{prog} --{found} takes no value")
            if has == 1 and not eq:
                if j + 1 >= len(words):
                    return j, seen, (j, f"{prog} --{found} needs a value")
                j += 1
                seen.append((key, words[j], j - 1))
            else:
                seen.append((key, value if eq else None, j))
            j += 1
            continue
        k = 1
        while k < len(w):
            c = w[k]
            takes = shorts.get(c)
            if takes is None:
                return j, seen, (j, f"-{c} is not an option of {prog} known here ({spec.source})")
            if takes == 0:
                seen.append((c, None, j))
                k += 1
                continue
            rest = w[k + 1 :]
            if rest or takes == 2:
                seen.append((c, rest or None, j))
            elif j + 1 >= len(words):
                return j, seen, (j, f"{prog} -{c} needs a value")
            else:
                j += 1
                seen.append((c, words[j], j - 1))
            break
        j += 1
    return j, seen, None


def _effects(prog: str, seen: list[tuple[str, str | None, int]]) -> list[EnvOp]:
    keys = {key for key, _, _ in seen}
    ops: list[EnvOp] = []
    if prog == "sudo":
        # sudo resets the environment (sudoers env_reset, on by default) unless -E / --preserve-env keeps it; -i
        # starts a login shell's environment (sudo(8) -E, -i, --preserve-env=list)
        listed = [v for key, v, _ in seen if key == "E" and v]
        if "i" in keys or "E" not in keys:
            ops.append(EnvOp("clear"))
        elif listed and not any(key == "E" and not v for key, v, _ in seen):
            ops.append(EnvOp("keep", names=frozenset(n for v in listed for n in v.split(","))))
    for key, value, _ in seen:
        if (prog, key) in (("env", "i"), ("exec", "c")):
            ops.append(EnvOp("clear"))
        elif (prog, key) == ("env", "u") and value:
            ops.append(EnvOp("unset", value))
    return ops


def unwrap(words: Sequence[str | None], assigns: Sequence[str | None] | None = None) -> Unwrapped:
    """The command behind the wrappers ``words`` start with (``WRAPPERS``), each wrapper's options read as it reads
    them. ``words``: None for a word not known here (an expansion); ``assigns``: the NAME of each ``NAME=VALUE``
    word (default: read from the words)."""
    names = list(assigns) if assigns is not None else [_assigned(w) for w in words]
    ops: list[EnvOp] = []
    i = 0
    while i < len(words):
        w = words[i]
        prog = posixpath.basename(w) if w is not None else ""
        spec = WRAPPERS.get(prog)
        if spec is None:
            return Unwrapped(i, ops)
        j = i + 1
        if spec.subcommand is not None:
            if words[j : j + 1] != [spec.subcommand]:
                return Unwrapped(i, ops)  # `uv pip …`: the program itself
            j += 1
        j, seen, problem = _options(prog, spec, words, j)
        if problem is not None:
            return Unwrapped(None, ops, problem)
        for key, _, at in seen:
            if key in spec.not_followed:
                return Unwrapped(None, ops, (at, f"{spec.not_followed[key]}: not followed here ({spec.source})"))
            if key in spec.no_command:
                return Unwrapped(None, ops)
        ops += _effects(prog, seen)
        if prog == "env" and words[j : j + 1] == ["-"]:  # "a mere - implies -i" (env --help)
            ops.append(EnvOp("clear"))
            j += 1
        while spec.assignments and j < len(words) and names[j] is not None:
            ops.append(EnvOp("set", names[j] or "", j))
            j += 1
        if spec.digits_operand and j + 1 < len(words) and (words[j] or "").isdigit():
            j += 1
        j += spec.operands
        i = j
    return Unwrapped(None, ops)


def apply_env(ops: Sequence[EnvOp], env: Mapping[str, V], value: Callable[[int], V | None]) -> dict[str, V]:
    """``env`` as the wrappers' ``ops`` leave it; ``value(index)``: the value a ``NAME=VALUE`` word sets (None: not
    known here, and the variable is left out)."""
    out = dict(env)
    for op in ops:
        if op.kind == "clear":
            out.clear()
        elif op.kind == "keep":
            out = {k: v for k, v in out.items() if k in op.names}
        elif op.kind == "unset":
            out.pop(op.name, None)
        else:
            v = value(op.index)
            if v is None:
                out.pop(op.name, None)
            else:
                out[op.name] = v
    return out


def server_at(words: Sequence[str | None], start: int = 0, scan: int = 64) -> int | None:
    """The first index from ``start`` (looking at most ``scan`` words on) where vLLM's server starts: a launch behind
    a wrapper argument this reader cannot follow is still one (and fails closed, placed)."""
    for k in range(start, min(len(words), start + scan)):
        if server_words(words[k:]) is not None:
            return k
    return None


def program_index(words: Sequence[str]) -> int:
    """Where the program of an exec-form argv is, behind its wrappers (``len(words)`` when they run none)."""
    got = unwrap(words)
    return got.index if got.index is not None else len(words)


@dataclass(slots=True)
class Start:
    """A launch in an exec-form argv: the indexes of the words it keeps, the environment it gets (the given one as
    the wrappers leave it), whether a wrapper started it from a cleared environment, and a located problem."""

    keep: list[int]
    env: dict[str, str]
    cleared: bool = False
    problem: tuple[int, str] | None = None
    ops: list[EnvOp] = field(default_factory=list)

    def env_from(self, base: Mapping[str, str], words: Sequence[str]) -> dict[str, str]:
        """The environment the launch gets when ``base`` is set before it."""
        return apply_env(self.ops, base, lambda k: words[k].partition("=")[2])


def launch_start(words: Sequence[str], env: Mapping[str, str] | None = None) -> Start | None:
    """For an exec-form argv (no shell: a Dockerfile's or a container's): the launch when it starts vLLM's server
    behind its wrappers (``env``: the variables set before it), else None."""
    got = unwrap(words)
    after = apply_env(got.env, env or {}, lambda k: words[k].partition("=")[2])
    cleared = any(op.kind in ("clear", "keep") for op in got.env)
    if got.problem is not None:
        at = server_at(words, got.problem[0])
        if at is None:
            return None
        return Start(list(range(at, len(words))), after, cleared, got.problem, got.env)
    if got.index is None:
        return None
    keep = server_words(words[got.index :])
    return Start([got.index + k for k in keep], after, cleared, None, got.env) if keep is not None else None
