"""A fake `nvidia-smi` replaying the real outputs in tests/fixtures/nvidia_smi/<node>/ (and the facts read from
them), and weights directories built from the model fixtures (tiny shard files stand in for tens of GB: only names,
sizes and digests are checked), with ``odd`` to turn one file into something that is not a regular file."""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil

from service.agent import gpus as g

NVIDIA_SMI = pathlib.Path(__file__).parent.parent / "fixtures" / "nvidia_smi"
MODELS = pathlib.Path(__file__).parent.parent / "fixtures" / "models"

FAKE = """#!/bin/sh
# replays {dir}
case "$*" in
  *--query-gpu=*) cat "{dir}/gpus.csv" ;;
  *--query-compute-apps=*) cat "{dir}/apps.csv" ;;
  *topo*) cat "{dir}/topo.txt" ;;
  *) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2 ;;
esac
"""


def install_nvidia_smi(bin_dir: pathlib.Path, scenario: str | pathlib.Path) -> pathlib.Path:
    """Write ``bin_dir/nvidia-smi`` replaying ``scenario`` (a folder name under tests/fixtures/nvidia_smi, or a
    folder). Re-installing switches the scenario (a GPU falls off the bus between two boots)."""
    src = scenario if isinstance(scenario, pathlib.Path) else NVIDIA_SMI / scenario
    bin_dir.mkdir(parents=True, exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    fake.write_text(FAKE.format(dir=src))
    fake.chmod(0o755)
    return fake


def weights_dir(
    dest: pathlib.Path,
    model: str = "meta-llama__Meta-Llama-3.1-8B",
    *,
    shards: int = 4,
    shard_bytes: int = 4096,
    tag: str | None = None,
) -> pathlib.Path:
    """A model directory: the fixture's config.json (and hf_quant_config.json), a safetensors index naming
    ``shards`` shards of ``shard_bytes`` bytes each (distinct contents), and ``quantization.txt`` when ``tag``."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in (MODELS / model).iterdir():
        if f.suffix == ".json":
            shutil.copy(f, dest / f.name)
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    for i, name in enumerate(names):
        (dest / name).write_bytes(_safetensors_shard(f"model.layers.{i}.weight", bytes([i % 251]), shard_bytes))
    index = {
        "metadata": {"total_size": shards * shard_bytes},
        "weight_map": {f"model.layers.{i}.weight": name for i, name in enumerate(names)},
    }
    (dest / "model.safetensors.index.json").write_text(json.dumps(index))
    if tag is not None:
        (dest / "quantization.txt").write_text(tag + "\n")
    return dest


def _safetensors_shard(name: str, fill: bytes, size: int) -> bytes:
    """A valid safetensors file of exactly ``size`` bytes: one U8 tensor ``name`` filling the rest with ``fill``."""
    for digits in range(1, 20):
        data = size - 8 - len(_st_header(name, 10**digits - 1))
        header = _st_header(name, data)
        if data >= 0 and 8 + len(header) + data == size:
            return len(header).to_bytes(8, "little") + header + fill * data
    raise ValueError(f"no safetensors file of {size} bytes")


def _st_header(name: str, n: int) -> bytes:
    return json.dumps({name: {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def observed(scenario: str) -> list[g.ObservedGpu]:
    return g.parse_gpus((NVIDIA_SMI / scenario / "gpus.csv").read_text())


def facts_of(scenario: str) -> dict:
    gpus = observed(scenario)
    return g.node_facts(gpus, g.parse_interconnect((NVIDIA_SMI / scenario / "topo.txt").read_text(), len(gpus)))


def odd(d: pathlib.Path, name: str, kind: str) -> None:
    p = d / name
    p.unlink()
    if kind == "loop":
        p.symlink_to(p.name)
    elif kind == "loop2":
        (d / "other").symlink_to(p.name)
        p.symlink_to("other")
    elif kind == "dangling":
        p.symlink_to("nowhere.safetensors")
    elif kind == "directory":
        p.mkdir()
    elif kind == "link-to-directory":
        (d / "sub").mkdir()
        p.symlink_to("sub")
