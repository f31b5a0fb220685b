"""``preflight check``: launches validated offline — launch-request JSON files, deploy files (shell scripts,
Dockerfiles, vLLM config YAML, compose / Kubernetes / Helm YAML) and a command after ``--`` (the work is
check_files.py's and check_sources.py's; the options are parsed there, the same with or without Typer)."""

import typer

from .check_files import run_check
from .check_sources import USAGE, UsageError, is_command, parse_options


def check(ctx: typer.Context) -> None:
    """Validate launches offline: launch-request .json files, shell scripts, Dockerfiles, vLLM config YAML,
    compose / Kubernetes / Helm YAML, or a command after --.

    Options: --gpu ID|"nvidia-smi name", --gpus N, --nodes M, --vllm-version V, --models NAME=DIR (repeatable),
    --environment production|benchmark, --policy PROFILE.toml, --format human|json|sarif|github (--json: json),
    --strict (warnings fail).

    Exit 0: nothing refused; 1: a launch is refused (or warned, with --strict); 2: bad usage or input."""
    try:
        opts = parse_options(_with_separator(list(ctx.args)))
    except UsageError as e:
        typer.echo(f"{USAGE}\nError: {e}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(run_check(opts, typer.echo))


def _with_separator(args: list[str]) -> list[str]:
    """Click keeps the words after ``--`` but drops the ``--`` itself: put it back before the command's first word
    (``vllm`` / ``python…`` that is no file here). ``preflight check`` itself parses without Click (check_files)."""
    import os

    if "--" in args:
        return args
    for k, a in enumerate(args):
        if is_command(args[k:]) and not os.path.exists(a):
            return [*args[:k], "--", *args[k:]]
    return args
