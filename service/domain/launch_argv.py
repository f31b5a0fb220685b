"""A launch's argv as the target release's ``vllm serve`` reads it: a command line found in a shell script, a
Dockerfile, a Kubernetes manifest or typed by hand, turned into (model, engine_args) for a launch request.

This is the *lenient* reader: it accepts everything the release's parser accepts and reads it the same way
(``render.parse_argv`` is the strict reader of Preflight's own rendered argv and refuses every rewrite). The steps
are vLLM's, in vLLM's order (vllm 0.33.0 vllm/utils/argparse_utils.py:313-513, FlexibleArgumentParser.parse_args):

1. ``vllm serve``: the first ``--model X`` / ``--model=X`` anywhere is moved to the front as the model (:323-357);
   a ``--served-model-name`` with no model in front and no ``--config`` is refused (:358-369).
2. ``--config FILE`` (exactly that word) pulls the YAML file's keys in after the model, so the command line wins
   (:371-372, :516-604; the file read as load_config_file reads it, :606-673).
3. ``--x_y`` becomes ``--x-y`` up to the first ``.``; ``-O3`` / ``-O=3`` / ``-O 3`` become ``--optimization-level``
   (:374-409).
4. Dotted keys (``--compilation-config.mode 3``, ``-cc.mode=3``, ``--x.y+ a,b``) are merged per key into one JSON
   object and appended at the end, so they replace a whole JSON value given elsewhere (:411-511).
5. argparse reads the rest (Python 3.11-3.12 argparse.py ``_parse_optional``/``consume_optional``): an element that
   begins with ``-`` is an option unless it is a negative number or holds a space; unique prefixes of long options
   are accepted (``allow_abbrev``, vllm/utils/argparse_utils.py:170-180); a repeated option's last value wins
   (append options accumulate); ``nargs='+'`` takes every following value; one stray word is the positional
   ``model_tag`` (vllm/entrypoints/common/cli_args.py:438-443), a second is "unrecognized arguments".

``python -m vllm.entrypoints.openai.api_server`` runs the same parser without the ``serve`` steps and serves
``--model`` (vllm/entrypoints/openai/api_server.py:50-59 → vllm/entrypoints/launchers/api_server/entry.py:204-226;
``vllm serve`` copies the positional over ``--model``: vllm/entrypoints/cli/serve.py:54-57).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .engine_args import MAX_LIST, abbreviations, coerce, parse_size
from .errors import DomainError
from .render import ArgvError, read_value
from .versions import K_BOOL, K_BOOL_VALUE, K_FLAG, Option, VersionLine

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
CLI_MODULE = "vllm.entrypoints.cli.main"  # what the ``vllm`` console script runs (``python -m … serve``)
MAX_WORDS = 4096  # a real launch has well under 200; bounded work whatever a file holds
MAX_WORD_CHARS = 65536
MAX_CONFIG_CHARS = 1 << 20
MAX_SHOWN = 10  # option strings quoted from an ambiguous prefix (``--`` matches every one)

PYTHON_PROGRAM = re.compile(r"python(\d(\.\d{1,2})?)?")  # python, python3, python3.12
_MODEL_WORD = re.compile(r"^--model(=.+|$)")  # vllm/utils/argparse_utils.py:326
_SERVED_NAME = re.compile(r"^--served[-_]model[-_]name(=.+|$)")  # :366
_CONFIG_WORD = re.compile(r"^--config(=.+|$)")  # :364
_UNTIL_DOT = re.compile(r"(?<=--)[^\.]*")  # :381 "everything between the first -- and the first ."
# argparse.py ``_negative_number_matcher`` (3.11/3.12): such elements are values (vLLM's parser defines no option
# that looks like a negative number)
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


class LaunchArgvError(ArgvError):
    """The release's parser would refuse the argv (or it cannot be read here). ``index``: the argv element at fault
    (None: the argv as a whole); ``field``: the engine argument concerned, when one is; ``key``: the ``--config``
    file's key that gave the element, when the file did."""

    def __init__(self, message: str, index: int | None, field: str | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.field = field
        self.key = key


@dataclass
class ReadArgv:
    """What the parse read. ``engine_args``: dest → value, typed as ``parse_engine_args`` reads it (a launch
    request's ``engine_args``); ``origin``: dest → index of the argv element that set it (the option word; for a
    value from ``--config FILE`` the ``--config`` word, with the file's key in ``config_keys``); ``model_index``: the
    element that gave the model (None: the config file did); ``notes``: (index or None, warning)."""

    model: str
    engine_args: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, int] = field(default_factory=dict)
    model_index: int | None = None
    notes: list[tuple[int | None, str]] = field(default_factory=list)
    config_keys: dict[str, str] = field(default_factory=dict)
    config_file: str | None = None
    entry: str = "vllm serve"  # or the module the argv runs

    @property
    def warnings(self) -> list[str]:
        return [text for _, text in self.notes]


@dataclass(frozen=True, slots=True)
class _El:
    """One element on its way through vLLM's rewrites: its text, the argv index it came from, and the config
    file's key when the file gave it."""

    text: str
    index: int
    key: str | None = None


def read_launch_argv(
    argv: Sequence[str], line: VersionLine, load_config: Callable[[str], str] | None = None
) -> ReadArgv:
    """Read ``vllm serve MODEL …`` (or ``python -m vllm.entrypoints.openai.api_server …``) as ``line``'s parser
    reads it. ``load_config(path)``: the text of a ``--config`` YAML file (None: a ``--config`` is an error).
    Raises LaunchArgvError naming the element at fault."""
    if len(argv) > MAX_WORDS:
        raise LaunchArgvError(f"the command has {len(argv)} words (more than {MAX_WORDS})", None)
    for i, word in enumerate(argv):
        if len(word) > MAX_WORD_CHARS or "\x00" in word:
            raise LaunchArgvError(f"word {i} is longer than {MAX_WORD_CHARS} characters or holds a NUL", i)
    start, entry = _entry(argv)
    serve = entry == "vllm serve"
    els = [_El(w, start + k) for k, w in enumerate(argv[start:])]
    out = ReadArgv(model="", entry=entry)
    if serve:
        els = _move_model(els, argv, out)
    if any(e.text == "--config" for e in els):
        els = _pull_config(els, serve, load_config, line, out)
    els = _rewrite_names(els)
    els = _merge_dotted(els, out)
    model_tag = _argparse(els, line, out)
    if not serve and model_tag is not None:
        out.notes.append(
            (
                model_tag.index,
                f"{entry} ignores the positional {model_tag.text!r}: it serves --model (vllm serve reads it)",
            )
        )
        model_tag = None
    given = out.engine_args.pop("model", None)
    model_at = out.origin.pop("model", None)
    if model_tag is not None:
        out.model, out.model_index = model_tag.text, model_tag.index
    elif given is not None:
        key = out.config_keys.pop("model", None)
        out.model, out.model_index = str(given), model_at if key is None else None
        if not out.model.strip():
            raise LaunchArgvError("the model is empty: name it as `vllm serve MODEL`", model_at, "model", key)
    else:
        default = line.options["model"].default if "model" in line.options else None
        raise LaunchArgvError(
            f"no model is given: vLLM would serve its default ({default!r}); name it as `vllm serve MODEL`", None
        )
    if not out.model.strip():  # vLLM would look for a model named '' and fail at start-up
        raise LaunchArgvError("the model is empty: name it as `vllm serve MODEL`", out.model_index, "model")
    return out


def _entry(argv: Sequence[str]) -> tuple[int, str]:
    """Where the parser's own arguments begin, and which entry point runs."""
    words = list(argv)
    if not words:
        raise LaunchArgvError("the command is empty", None)
    prog = os.path.basename(words[0])
    if prog == "vllm" and words[1:2] == ["serve"]:
        return 2, "vllm serve"
    if PYTHON_PROGRAM.fullmatch(prog) and len(words) > 2 and words[1] == "-m":
        if words[2] == API_SERVER_MODULE:
            return 3, API_SERVER_MODULE
        if words[2] == CLI_MODULE and words[3:4] == ["serve"]:
            return 4, "vllm serve"
    if prog == "vllm":
        raise LaunchArgvError(f"`vllm {' '.join(words[1:2])}` is not `vllm serve`", 1 if len(words) > 1 else 0)
    raise LaunchArgvError(
        f"{words[0]!r} does not start vLLM's server (`vllm serve MODEL` or `python -m {API_SERVER_MODULE}`)", 0
    )


def _move_model(els: list[_El], argv: Sequence[str], out: ReadArgv) -> list[_El]:
    """vllm/utils/argparse_utils.py:323-369: the first ``--model`` moves to the front."""
    at = next((k for k, e in enumerate(els) if _MODEL_WORD.match(e.text)), None)
    if at is not None:
        word = els[at]
        if word.text == "--model":
            if at + 1 >= len(els):  # vLLM: IndexError
                raise LaunchArgvError("--model is the last word: it needs the model after it", word.index)
            tag, rest = _El(els[at + 1].text, word.index), at + 2
        else:
            tag, rest = _El(word.text.removeprefix("--model="), word.index), at + 1
        later = [e for e in els[rest:] if _MODEL_WORD.match(e.text)]
        if later:
            out.notes.append(
                (
                    later[0].index,
                    f"--model is given again: `vllm serve` serves the first one ({tag.text!r}) and ignores this one",
                )
            )
        els = [tag, *els[:at], *els[rest:]]
    if (
        els
        and els[0].text.startswith("-")
        and not any(_CONFIG_WORD.match(e.text) for e in els)
        and any(_SERVED_NAME.match(e.text) for e in els)
    ):
        raise LaunchArgvError(
            "`model` should be provided as the first positional argument when using `vllm serve` (vLLM refuses "
            "--served-model-name without it)",
            els[0].index,
        )
    return els


def _pull_config(
    els: list[_El], serve: bool, load_config: Callable[[str], str] | None, line: VersionLine, out: ReadArgv
) -> list[_El]:
    """vllm/utils/argparse_utils.py:516-604: the file's arguments go after the model, before the command line's."""
    at = [k for k, e in enumerate(els) if e.text == "--config"]
    if len(at) > 1:  # vLLM: "More than one config file specified!"
        raise LaunchArgvError("--config is given twice: vLLM reads only one config file", els[at[1]].index)
    k = at[0]
    word = els[k]
    if k == len(els) - 1:
        raise LaunchArgvError("--config is the last word: no config file is named", word.index)
    path = els[k + 1].text
    if path.split(".")[-1] not in ("yaml", "yml"):  # :633-637
        raise LaunchArgvError(
            f"--config {path}: vLLM reads only a .yaml / .yml config file", els[k + 1].index, field="config"
        )
    if load_config is None:
        raise LaunchArgvError(
            f"--config {path} cannot be read here: give the file's contents (or check the file it lives beside)",
            els[k + 1].index,
            field="config",
        )
    try:
        text = load_config(path)
    except (OSError, ValueError) as e:
        raise LaunchArgvError(f"--config {path} cannot be read: {e}", els[k + 1].index, field="config") from None
    out.config_file = path
    pulled = [_El(t, word.index, key) for t, key in config_arguments(text, line)]
    rest = els[:k] + els[k + 2 :]
    if not serve:  # no sub command: the file's arguments come first (:569-571)
        return pulled + rest
    if rest and not rest[0].text.startswith("-"):  # the model on the command line stays in front (:585-592)
        return [rest[0], *pulled, *rest[1:]]
    if not any(e.text == "--model" for e in pulled):
        raise LaunchArgvError(
            "No model specified! Please specify model either as a positional argument or in a config file.",
            word.index,
        )
    return pulled + rest


MAX_CONFIG_NODES = 100_000  # YAML nodes with every alias expanded (a "billion laughs" file is refused unexpanded)


def expanded_nodes(text: str, limit: int = MAX_CONFIG_NODES) -> int:
    """How many nodes the YAML holds with every alias expanded, counted from PyYAML's event stream before anything
    is built; a ``ValueError`` past ``limit``."""
    import yaml

    anchors: dict[str, int] = {}
    stack: list[list[Any]] = [[0, None]]  # per open collection: [nodes so far, its anchor]
    total = 0  # nodes counted so far (in open collections and in closed ones)
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            stack.append([1, event.anchor])
            total += 1
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            size, anchor = stack.pop()
            if anchor:
                anchors[anchor] = size
            stack[-1][0] += size  # moved to the parent: the total stays
        elif isinstance(event, (yaml.AliasEvent, yaml.ScalarEvent)):
            alias = isinstance(event, yaml.AliasEvent)
            size = anchors.get(event.anchor or "", 1) if alias else 1
            if event.anchor and not alias:
                anchors[event.anchor] = 1
            stack[-1][0] += size
            total += size
        if total > limit:
            raise ValueError(f"more than {limit} YAML nodes with aliases expanded")
    return total


def load_config_yaml(text: str) -> Any:
    """A vLLM config YAML as PyYAML's safe_load reads it (vLLM's reader), refused first when its aliases expand
    beyond MAX_CONFIG_NODES."""
    import yaml

    expanded_nodes(text)
    return yaml.safe_load(text)


def config_arguments(text: str, line: VersionLine) -> list[tuple[str, str]]:
    """A vLLM config YAML's arguments as vllm/utils/argparse_utils.py:606-673 (load_config_file) lists them, each
    with the key that gave it: ``true`` → ``--key``, ``false`` → ``--no-key`` when the parser has it (else nothing),
    a list → ``--key item…`` (nothing when empty), an object → ``--key JSON``, anything else → ``--key str(value)``.
    PyYAML's safe_load, as vLLM reads it (YAML 1.1: ``yes`` is true)."""
    import yaml

    if len(text) > MAX_CONFIG_CHARS:
        raise LaunchArgvError(f"the config file is larger than {MAX_CONFIG_CHARS} characters", None, field="config")
    try:
        data = load_config_yaml(text)
    except (yaml.YAMLError, RecursionError, ValueError) as e:
        raise LaunchArgvError(f"the config file is not YAML vLLM can read: {e}", None, field="config") from None
    if not isinstance(data, dict):  # vLLM calls config.items(): anything else fails at start-up
        raise LaunchArgvError("the config file must hold a mapping of option names to values", None, field="config")
    out: list[tuple[str, str]] = []
    for key, value in data.items():
        name = str(key)
        if isinstance(value, bool):
            if value:
                out.append(("--" + name, name))
            elif f"--no-{name}" in line.spellings:
                out.append((f"--no-{name}", name))
        elif isinstance(value, list):
            if value:
                out += [("--" + name, name), *((_py_str(v), name) for v in value)]
        elif isinstance(value, dict):
            out += [("--" + name, name), (json.dumps(value), name)]
        else:
            out += [("--" + name, name), (_py_str(value), name)]
    return out


def _py_str(value: Any) -> str:
    """``str(value)`` as vLLM applies it to a YAML scalar (a date, a float, None → 'None')."""
    return str(value)


def _rewrite_names(els: list[_El]) -> list[_El]:
    """vllm/utils/argparse_utils.py:374-409: dashes for underscores in long names (up to the first '.'), -O forms."""
    out: list[_El] = []
    for k, e in enumerate(els):
        arg = e.text
        if arg.startswith("--help="):
            raise LaunchArgvError(f"{arg!r} prints vLLM's help instead of serving", e.index)
        if arg.startswith("--"):
            if "=" in arg:
                key, value = arg.split("=", 1)
                out.append(_El(_UNTIL_DOT.sub(_dashes, key, count=1) + "=" + value, e.index, e.key))
            else:
                out.append(_El(_UNTIL_DOT.sub(_dashes, arg, count=1), e.index, e.key))
        elif arg.startswith("-O") and arg != "-O":
            level = arg[3:] if arg[2] == "=" else arg[2:]
            out += [_El("--optimization-level", e.index, e.key), _El(level, e.index, e.key)]
        elif arg == "-O" and k + 1 < len(els) and els[k + 1].text in {"0", "1", "2", "3"}:
            out.append(_El("--optimization-level", e.index, e.key))
        else:
            out.append(e)
    return out


def _dashes(match: re.Match[str]) -> str:
    return match.group(0).replace("_", "-")


def _merge_dotted(els: list[_El], out: ReadArgv) -> list[_El]:
    """vllm/utils/argparse_utils.py:411-511: ``--x.a.b v`` elements merged per ``--x`` into one JSON object,
    appended after everything else (so it replaces a whole ``--x JSON`` given elsewhere)."""
    delete: set[int] = set()
    merged: dict[str, dict[str, Any]] = {}
    first: dict[str, _El] = {}
    for k, e in enumerate(els):
        if k in delete:
            continue
        arg = e.text
        if not (arg.startswith("-") and "." in arg) or (arg.startswith("--") and "." not in arg):
            continue
        if "=" in arg:
            arg, value_text = arg.split("=", 1)
            if "." not in arg:
                continue  # the '.' was in the value
        else:
            if k + 1 >= len(els):  # vLLM: IndexError
                raise LaunchArgvError(f"{arg!r} is the last word: a dotted key needs a value", e.index)
            value_text = els[k + 1].text
            delete.add(k + 1)
        if arg.endswith("+"):
            arg = arg[:-1]
            value_text = json.dumps(value_text.split(","))
        key, *keys = arg.split(".")
        if not key or not all(keys):
            raise LaunchArgvError(f"{e.text!r} is not a dotted key vLLM can read", e.index)
        try:
            nested: Any = _dotted_value(value_text)
        except RecursionError:  # vLLM's json.loads fails the same way
            raise LaunchArgvError(f"{e.text!r}: its value is JSON nested too deeply", e.index) from None
        for part in reversed(keys):
            nested = {part: nested}
        dups = _update(merged.setdefault(key, {}), nested)
        first.setdefault(key, e)
        for d in sorted(dups):
            out.notes.append((e.index, f"{key}.{d} is given twice: the last value wins"))
        delete.add(k)
    kept = [e for k, e in enumerate(els) if k not in delete]
    for key, value in merged.items():
        at = first[key]
        kept += [_El(key, at.index, at.key), _El(json.dumps(value), at.index, at.key)]
    return kept


def _dotted_value(text: str) -> Any:
    """JSON, else a human-readable integer, else the text (vllm/utils/argparse_utils.py:492-501)."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return parse_size(text, "value")
    except DomainError:
        return text


def _update(original: dict[str, Any], update: dict[str, Any]) -> set[str]:
    """recursive_dict_update (vllm/utils/argparse_utils.py:443-462): lists concatenate, the rest is replaced."""
    dups: set[str] = set()
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(original.get(k), dict):
            dups |= {f"{k}.{d}" for d in _update(original[k], v)}
        elif isinstance(v, list) and isinstance(original.get(k), list):
            original[k] = original[k] + v
        else:
            if k in original:
                dups.add(k)
            original[k] = v
    return dups


# ------------------------------------------------------------------------------------------------------- argparse


def _option_of(arg: str, line: VersionLine) -> tuple[str, str | None, bool] | None:
    """argparse's ``_parse_optional``: (the option string, the explicit ``=`` value, whether it was abbreviated)
    for an element that is an option (an unknown one too), None for a value."""
    if not arg or arg[0] != "-" or arg == "-":
        return None
    if arg in line.spellings or arg in line.help_strings:
        return arg, None, False
    if "=" in arg:
        key, value = arg.split("=", 1)
        if key in line.spellings:
            return key, value, False
    if len(arg) > 2 and arg[1] != "-" and arg[:2] in line.spellings:  # -qfp8: a short option and its value
        return arg[:2], arg[2:], False
    key, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
    matches = abbreviations(key, line)
    if len(matches) > 1:
        shown = ", ".join(matches[:MAX_SHOWN]) + (
            f" and {len(matches) - MAX_SHOWN} more" if len(matches) > MAX_SHOWN else ""
        )
        raise LaunchArgvError(f"ambiguous option: {key} could match {shown}", None)
    if len(matches) == 1:
        return matches[0], (value if eq else None), True
    if _NEGATIVE_NUMBER.match(arg) or " " in arg:
        return None
    return key, (value if eq else None), False


def _argparse(els: list[_El], line: VersionLine, out: ReadArgv) -> _El | None:
    """Consume the elements as argparse does; returns the positional model_tag element, if any."""
    model_tag: _El | None = None
    seen: dict[str, _El] = {}
    k = 0
    while k < len(els):
        try:
            k, model_tag = _argparse_one(els, k, line, out, seen, model_tag)
        except LaunchArgvError as err:
            if err.key is None:
                err.key = els[k].key  # an element of the --config file: refused at its key
            raise
    return model_tag


def _argparse_one(
    els: list[_El], k: int, line: VersionLine, out: ReadArgv, seen: dict[str, _El], model_tag: _El | None
) -> tuple[int, _El | None]:
    """One option (with its values) or the positional at ``els[k]``: the next index, and the model_tag."""
    e = els[k]
    if e.text == "--":
        raise LaunchArgvError("'--' ends the options: vLLM would read what follows as stray arguments", e.index)
    try:
        parsed = _option_of(e.text, line)
    except LaunchArgvError as err:
        raise LaunchArgvError(str(err), e.index) from None
    if parsed is None:
        if model_tag is not None:
            raise LaunchArgvError(
                f"{e.text!r} is a value that no option takes (vllm: error: unrecognized arguments)", e.index
            )
        return k + 1, e
    spelled, explicit, abbreviated = parsed
    if spelled in line.help_strings:
        raise LaunchArgvError(f"{e.text!r} prints vLLM's help instead of serving", e.index)
    dest = line.spellings.get(spelled)
    if dest is None:
        return _unknown(els, k, spelled, explicit, line, out), model_tag
    if abbreviated:
        out.notes.append((e.index, f"{e.text.split('=', 1)[0]!r} is read as {spelled} (an abbreviation)"))
    opt = line.options[dest]
    k, value = _consume(els, k + 1, e, spelled, explicit, opt, line)
    if dest == "config":
        out.notes.append(
            (
                e.index,
                f"{e.text!r}: vLLM reads a config file only from the two words `--config FILE`; this one is "
                "accepted and ignored (vllm/utils/argparse_utils.py:371)",
            )
        )
        return k, model_tag
    if opt.appends and dest in out.engine_args:
        out.engine_args[dest] = out.engine_args[dest] + value
        _check_count(spelled, opt, out.engine_args[dest], e)
        return k, model_tag
    before = seen.get(dest)
    if before is not None and before.key is None and e.key is None:
        out.notes.append(
            (e.index, f"{spelled} is given twice (also word {before.index}): the last value, {_shown(value)}, wins")
        )
    seen[dest] = e
    out.engine_args[dest] = value
    out.origin[dest] = e.index
    if e.key is not None:
        out.config_keys[dest] = e.key
    else:
        out.config_keys.pop(dest, None)
    return k, model_tag


def _check_count(spelled: str, opt: Option, value: Any, e: _El) -> None:
    """A list option holds at most MAX_LIST values (parse_engine_args' bound), refused at the option's word."""
    if isinstance(value, list) and len(value) > MAX_LIST:
        raise LaunchArgvError(
            f"argument {spelled}: {len(value)} values, more than the {MAX_LIST} Preflight reads",
            e.index,
            field=opt.dest,
        )


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def _values(els: list[_El], k: int, line: VersionLine) -> list[_El]:
    """The elements from ``k`` up to the next option."""
    taken: list[_El] = []
    while k < len(els) and _is_value(els[k].text, line):
        taken.append(els[k])
        k += 1
    return taken


def _is_value(text: str, line: VersionLine) -> bool:
    try:
        return _option_of(text, line) is None and text != "--"
    except LaunchArgvError:
        return False  # an ambiguous prefix is still an option


def _consume(
    els: list[_El], k: int, e: _El, spelled: str, explicit: str | None, opt: Option, line: VersionLine
) -> tuple[int, Any]:
    """argparse consume_optional for one option: (the next index, the value as parse_engine_args reads it)."""
    dest = opt.dest
    if opt.kind is K_BOOL or opt.kind is K_FLAG:
        if explicit is not None:
            raise LaunchArgvError(f"argument {spelled}: ignored explicit argument {explicit!r}", e.index, field=dest)
        return k, (spelled not in opt.negative) if opt.kind is K_BOOL else True
    if explicit is not None:
        texts = [_El(explicit, e.index, e.key)]
    else:
        texts = _values(els, k, line)
        if opt.nargs == "?" and not texts:
            return k, opt.const
        if not opt.is_list or opt.appends:
            texts = texts[:1]
        elif isinstance(opt.nargs, int):
            texts = texts[: opt.nargs]
        k += len(texts)
    if not texts and opt.nargs != "*":
        what = "at least one argument" if opt.nargs == "+" else "one argument"
        raise LaunchArgvError(f"argument {spelled}: expected {what}", e.index, field=dest)
    _check_count(spelled, opt, texts, e)
    if opt.kind is K_BOOL_VALUE:
        if texts[0].text.lower() not in ("true", "false"):
            raise LaunchArgvError(f"argument {spelled}: expects true or false", texts[0].index, field=dest)
        return k, texts[0].text.lower() == "true"
    return k, _typed(spelled, opt, texts)


def _typed(spelled: str, opt: Option, texts: list[_El]) -> Any:
    dest = opt.dest
    at = texts[0]
    try:
        if opt.action == "LoRAParserAction":
            return coerce(dest, opt, [t.text for t in texts])
        if opt.is_list:
            return [_one(opt, t) for t in texts]
        return _one(opt, at)
    except DomainError as err:
        raise LaunchArgvError(f"argument {spelled}: {err.message}", at.index, field=dest) from None
    except ValueError as err:  # JSON text that is no JSON
        raise LaunchArgvError(f"argument {spelled}: {err}", at.index, field=dest) from None
    except RecursionError:  # JSON nested deeper than the parser goes (vLLM's json.loads fails the same way)
        raise LaunchArgvError(f"argument {spelled}: JSON nested too deeply", at.index, field=dest) from None


def _one(opt: Option, el: _El) -> Any:
    if opt.optional and el.text in ("", "None"):
        return el.text  # '' and 'None' read as None (vllm/engine/arg_utils.py:173-179): parse_engine_args knows
    return read_value(opt.dest, opt, el.text)


def _unknown(els: list[_El], k: int, spelled: str, explicit: str | None, line: VersionLine, out: ReadArgv) -> int:
    """An option the release does not define. One an older release had (``--swap-space``) goes into engine_args as
    given, for ``flag_unsupported`` to say what replaced it; anything else is vLLM's "unrecognized arguments"."""
    e = els[k]
    name = spelled.lstrip("-").replace("-", "_")
    if spelled.startswith("--") and name in line.removed:
        texts = [explicit] if explicit is not None else [t.text for t in _values(els, k + 1, line)]
        out.engine_args[name] = True if not texts else texts[0] if len(texts) == 1 else texts
        out.origin[name] = e.index
        return k + 1 + (0 if explicit is not None else len(texts))
    near = difflib.get_close_matches(spelled, line.parser_strings, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(near)}?" if near else ""
    raise LaunchArgvError(
        f"{spelled} is not an option of vLLM {line.newest} (vllm: error: unrecognized arguments){hint}",
        e.index,
        field=name,
    )
