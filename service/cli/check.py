"""``preflight check``: launch-request files validated offline (the work is check_files.py's)."""

import pathlib

import typer

from .check_files import check_files


def check(
    files: list[pathlib.Path] = typer.Argument(..., help="Launch-request JSON files."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per file, one per line."),
    policy: pathlib.Path | None = typer.Option(
        None, "--policy", help="A policy profile (TOML) to judge under instead of the shipped one."
    ),
    strict: bool = typer.Option(False, "--strict", help="Warnings fail too (exit 1 for a verdict warn)."),
) -> None:
    """Validate launch-request files offline. Exit 0: nothing rejected; 1: a launch is rejected (or, with --strict,
    warned); 2: bad input (a file, or the --policy profile)."""
    raise typer.Exit(check_files(files, as_json, typer.echo, policy_file=policy, strict=strict))
