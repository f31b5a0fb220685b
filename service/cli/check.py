"""``preflight check``: launches validated offline — launch-request JSON files, deploy files (shell scripts,
Dockerfiles, vLLM config YAML, compose / Kubernetes / Helm YAML) and a command after ``--`` (the work is
check_files.py's and check_sources.py's; the options are parsed there, the same with or without Typer).

The options are declared on the command for ``--help`` only: ``CheckCommand`` hands every argument, ``--``
included, to check_sources.parse_options untouched, so the Typer path and the plain one (service/cli/__init__.py,
which never builds the command line) read one command line alike."""

import pathlib
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from .check_files import run_check
from .check_sources import FORMATS, USAGE, UsageError, parse_options


class CheckCommand(TyperCommand):
    """Click parses nothing but a ``--help`` before ``--``: the arguments go to the callback as given."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # Any: the click Typer builds on
        head = args[: args.index("--")] if "--" in args else args
        if "--help" in head:
            return super().parse_args(ctx, ["--help"])
        ctx.args = list(args)
        return ctx.args


def check(
    ctx: typer.Context,
    files: Annotated[
        list[pathlib.Path] | None,
        typer.Argument(
            metavar="FILE|DIRECTORY",
            help="Launch-request .json files, shell scripts, Dockerfiles, vLLM config YAML, compose / Kubernetes / "
            "Helm YAML; after --, a command: vllm serve MODEL … or python -m vllm.entrypoints.openai.api_server …",
            show_default=False,
        ),
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            "--gpu",
            metavar="ID",
            help='The GPU: a catalogue id or the name nvidia-smi prints ("NVIDIA H100 80GB HBM3").',
        ),
    ] = None,
    gpus: Annotated[
        int | None, typer.Option("--gpus", metavar="N", help="GPUs per node, where a file does not say.")
    ] = None,
    nodes: Annotated[int | None, typer.Option("--nodes", metavar="M", help="Nodes, where a file does not say.")] = None,
    vllm_version: Annotated[
        str | None, typer.Option("--vllm-version", metavar="V", help="The vLLM release to judge against.")
    ] = None,
    models: Annotated[
        list[str] | None,
        typer.Option("--models", metavar="NAME=DIR", help="Where a model's config.json is read (repeatable)."),
    ] = None,
    environment: Annotated[
        str, typer.Option("--environment", metavar="production|benchmark", help="The policy's environment.")
    ] = "production",
    policy: Annotated[
        pathlib.Path | None,
        typer.Option("--policy", metavar="PROFILE.toml", help="A policy profile instead of the shipped one."),
    ] = None,
    format: Annotated[
        str,
        typer.Option(
            "--format",
            metavar="|".join(FORMATS),
            help="The output: human, json lines, SARIF 2.1.0, GitHub annotations.",
        ),
    ] = "human",
    json: Annotated[bool, typer.Option("--json", help="--format json.")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail (exit 1).")] = False,
) -> None:
    """Validate launches offline: launch-request .json files, shell scripts, Dockerfiles, vLLM config YAML,
    compose / Kubernetes / Helm YAML, or a command after --.

    Exit 0: nothing refused; 1: a launch is refused (or warned, with --strict); 2: bad usage or input."""
    try:
        opts = parse_options(list(ctx.args))
    except UsageError as e:
        typer.echo(f"{USAGE}\nError: {e}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(run_check(opts, typer.echo))
