"""``preflight check``: launch-request files validated offline (the work is check_files.py's)."""

import pathlib

import typer

from .check_files import check_files


def check(
    files: list[pathlib.Path] = typer.Argument(..., help="Launch-request JSON files."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per file, one per line."),
) -> None:
    """Validate launch-request files offline. Exit 0: nothing rejected; 1: a launch is rejected; 2: bad input."""
    raise typer.Exit(check_files(files, as_json, typer.echo))
