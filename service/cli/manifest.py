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


def _directory_body(directory: pathlib.Path, hash_shards: bool) -> dict:
    """What ``manifest push DIR`` registers of a directory: its JSON files, the files record, the inventory."""
    # the directory read as hostile first (no FIFO, no symlink out of it, bounded), then its JSON files
    files = _describe_weights(directory, hash_shards)
    return {**read_model_dir(directory), "files": files, "tensors": _tensors(directory)}


def _hub_body(repo: str, revision: str | None, timeout: float) -> tuple[dict, str | None]:
    """What ``manifest push --hub REPO`` registers — the same as ``manifest push DIR`` of the repository at one
    commit — and that commit. Offline (``HF_HUB_OFFLINE``), the repository's snapshot in the local cache is read
    as a directory; online, the small files whole and the safetensors headers by range (tensor_readers.py)."""
    import hashlib

    from ..agent.weights import quant_method
    from ..tensor_readers import COMMIT, cached_snapshot, inventory_record, read_hub_checkpoint

    snapshot = cached_snapshot(repo, revision)
    if snapshot is not None:  # …/snapshots/<commit>
        return _directory_body(snapshot, False), snapshot.name if COMMIT.fullmatch(snapshot.name) else None
    cp = read_hub_checkpoint(repo, revision=revision, timeout=timeout)
    body: dict = {"config": json.loads(cp.small["config.json"])}  # each checked by read_hub_checkpoint
    tag, hf_quant = cp.small.get("quantization.txt"), cp.small.get("hf_quant_config.json")
    if tag is not None:
        body["quantization_txt"] = tag.decode("utf-8")
    if hf_quant is not None:
        body["hf_quant_config"] = json.loads(hf_quant)
    total = cp.index.total_size if cp.index is not None else None
    if total is not None:
        body["weights_bytes"] = total
    body["files"] = {  # agent/weights.py ``describe``'s record, from what the server sent
        "config_sha256": hashlib.sha256(cp.small["config.json"]).hexdigest(),
        "quantization": quant_method(tag) if tag is not None else None,
        "hf_quant_config_sha256": hashlib.sha256(hf_quant).hexdigest() if hf_quant is not None else None,
        "total_size": total,
        "shards": [{"name": name, "size": size} for name, size in cp.sizes.items()],
    }
    body["tensors"] = inventory_record(cp.inventory)
    return body, cp.commit


@manifest_app.command("push")
def manifest_push(
    directory: pathlib.Path | None = typer.Argument(None, help="Model directory holding config.json."),
    hub: str | None = typer.Option(
        None,
        "--hub",
        help="Read the model from this Hugging Face Hub repository (owner/name) instead of a directory: "
        "config.json, quantization.txt, hf_quant_config.json and the safetensors headers (by HTTP range, never "
        "a weight), at one commit. HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE (then: the local cache) are honoured.",
    ),
    revision: str | None = typer.Option(None, help="With --hub: the branch, tag or commit (default: main)."),
    hub_timeout: float = typer.Option(60.0, min=1, max=3600, help="With --hub: seconds allowed per file read."),
    server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
    token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN"),
    name: str | None = typer.Option(None, help="Manifest name (default: the directory name, or the repository id)."),
    version: str | None = typer.Option(None, help="Manifest version (default: 1, or with --hub the commit)."),
    uri: str | None = typer.Option(
        None, help="Where nodes load the weights (default: the path, or with --hub the repository id)."
    ),
    tp_sharded: int | None = typer.Option(None, help="Checkpoint saved per rank at this TP."),
    hash_shards: bool = typer.Option(
        False,
        "--hash-shards",
        help="Also record each shard's SHA-256 (reads every shard: tens "
        "of GB; nodes verify them with --verify-hashes). Not with --hub.",
    ),
    allow_remote_code: bool = typer.Option(
        False,
        "--allow-remote-code",
        help="Production plans of this manifest may load code on the node (--trust-remote-code, plugins, "
        "worker classes, …); the manifest's digest covers it.",
    ),
) -> None:
    """Register a model directory (or, with --hub, a Hub repository at one commit) as a manifest, with what the
    launch depends on in it: config.json's SHA-256, the quantization tag, hf_quant_config.json, the safetensors
    index's shards and sizes (nodes check them at boot), and the tensor inventory from the safetensors headers
    (layout digest, bytes by dtype, the format the tensors show)."""
    from ..agent.weights import WeightsError

    if (directory is None) == (hub is None) or (hub is None and revision is not None) or (hub and hash_shards):
        typer.echo(
            "preflight: give a DIRECTORY or --hub REPO (--revision only with --hub; --hash-shards not)", err=True
        )
        raise typer.Exit(2)
    commit = None
    try:
        if hub is not None:
            body, commit = _hub_body(hub, revision, hub_timeout)
        elif directory is not None:
            body = _directory_body(directory, hash_shards)
    except ImportError as exc:  # an install without its dependencies (pip --no-deps)
        typer.echo(f"preflight: --hub needs huggingface_hub (pip install huggingface_hub): {exc}", err=True)
        raise typer.Exit(2)
    except (OSError, ValueError, RecursionError, WeightsError) as exc:
        typer.echo(f"preflight: {exc}", err=True)
        raise typer.Exit(2)
    if commit is not None:  # the manifest names the commit judged
        body["digests"] = {"hf_commit": commit}
        typer.echo(f"preflight: {hub} at commit {commit}", err=True)
    body.update(
        name=name or hub or (directory.name if directory else ""),
        version=version or commit or "1",
        uri=uri or hub or str(pathlib.Path(directory or ".").resolve()),
        checkpoint={"layout": "tp_sharded", "tensor_parallel_size": tp_sharded} if tp_sharded else {"layout": "merged"},
        allow_remote_code=allow_remote_code,
    )
    r = common.client(server, token).post("/v1/manifests", json=body)
    common.fail_on_problem(r)
    typer.echo(json.dumps(r.json(), indent=2))
