"""``preflight manifest``: weight manifests."""

import json
import pathlib
import sys

import typer

from . import common
from .check_files import read_model_dir

manifest_app = typer.Typer(help="Weight manifests.", no_args_is_help=True, rich_markup_mode="markdown")


def _describe_weights(directory: pathlib.Path, hash_shards: bool) -> dict:
    """agent/weights.py's record of the directory; with hashing, a progress bar over the shards' bytes."""
    from ..agent.weights import describe

    if not hash_shards:
        return describe(directory)
    total = sum(s["size"] for s in describe(directory)["shards"])
    with typer.progressbar(length=total, label="hashing shards", file=sys.stderr) as bar:
        return describe(directory, hash_shards=True, on_bytes=bar.update)


def _tensors(directory: pathlib.Path) -> dict | None:
    """The tensor inventory from the safetensors headers (None, said on stderr, when the checkpoint has no
    safetensors files); a hostile header is refused (TensorsError is a ValueError)."""
    from ..domain.tensors import TensorsError
    from ..tensor_readers import inventory_record, read_directory

    try:
        return inventory_record(read_directory(directory))
    except TensorsError as exc:
        if exc.rule != "safetensors_absent":
            raise
        typer.echo(f"preflight: {exc.message}: no tensor inventory recorded", err=True)
        return None


@manifest_app.command("push")
def manifest_push(
    directory: pathlib.Path = typer.Argument(..., help="Model directory holding config.json."),
    server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
    token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN"),
    name: str | None = typer.Option(None, help="Manifest name (default: the directory name)."),
    version: str = typer.Option("1", help="Manifest version."),
    uri: str | None = typer.Option(None, help="Where nodes load the weights (default: the path)."),
    tp_sharded: int | None = typer.Option(None, help="Checkpoint saved per rank at this TP."),
    hash_shards: bool = typer.Option(
        False,
        "--hash-shards",
        help="Also record each shard's SHA-256 (reads every shard: tens "
        "of GB; nodes verify them with --verify-hashes).",
    ),
    allow_remote_code: bool = typer.Option(
        False,
        "--allow-remote-code",
        help="Production plans of this manifest may load code on the node (--trust-remote-code, plugins, "
        "worker classes, …); the manifest's digest covers it.",
    ),
) -> None:
    """Register a model directory as a manifest, with what the launch depends on in it: config.json's SHA-256, the
    quantization tag, hf_quant_config.json, the safetensors index's shards and sizes (nodes check them at boot), and
    the tensor inventory from the safetensors headers (layout digest, bytes by dtype, the format the tensors show)."""
    from ..agent.weights import WeightsError

    try:  # the directory read as hostile first (no FIFO, no symlink out of it, bounded), then its JSON files
        files = _describe_weights(directory, hash_shards)
        body = {**read_model_dir(directory), "files": files, "tensors": _tensors(directory)}
    except (OSError, ValueError, RecursionError, WeightsError) as exc:
        typer.echo(f"preflight: {exc}", err=True)
        raise typer.Exit(2)
    body.update(
        name=name or directory.name,
        version=version,
        uri=uri or str(directory.resolve()),
        checkpoint={"layout": "tp_sharded", "tensor_parallel_size": tp_sharded} if tp_sharded else {"layout": "merged"},
        allow_remote_code=allow_remote_code,
    )
    r = common.client(server, token).post("/v1/manifests", json=body)
    common.fail_on_problem(r)
    typer.echo(json.dumps(r.json(), indent=2))
