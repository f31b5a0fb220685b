"""A launch's model and hardware for the check (minimal form: a local model directory or ``--models NAME=DIR``; the
full resolver — Hugging Face cache, the Hub — has the same signatures). Nothing is guessed: what cannot be
resolved is a ResolveError the caller places at the launch's model word or its start."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping

from .found import FoundLaunch


class ResolveError(ValueError):
    pass


def resolve_model(
    ref: str,
    *,
    revision: str | None = None,
    models: Mapping[str, str | os.PathLike[str]] | None = None,
    env: Mapping[str, str] = os.environ,
) -> dict:
    """The launch request's ``model`` object (name, uri, config, quantization_txt?, hf_quant_config?,
    weights_bytes?, preprocessor_config?) for the model a launch names."""
    from ..cli.check_files import read_json, read_model_dir

    given = (models or {}).get(ref)
    d = pathlib.Path(given) if given is not None else pathlib.Path(ref)
    if given is None and not d.is_dir():
        raise ResolveError(
            f"model {ref!r} is not a local directory here; give its files with --models {ref}=DIR "
            "(a directory holding its config.json)"
        )
    try:
        out = {"name": ref, "uri": ref, **read_model_dir(d)}
        pre = d / "preprocessor_config.json"
        if pre.is_file():
            out["preprocessor_config"] = read_json(pre)
    except (OSError, ValueError, RecursionError) as e:
        raise ResolveError(f"model {ref!r}: {e}") from None
    return out


def resolve_hardware(gpu: str | None, gpus: int | None, nodes: int | None, found: FoundLaunch) -> dict:
    """The launch request's ``hardware`` object: the options first, then what the file says."""
    from ..domain.gpus import lookup

    name = gpu or found.gpu_product
    if not name:
        raise ResolveError(
            "the launch does not say which GPU it runs on: give --gpu (a catalogue id or nvidia-smi name)"
        )
    known = lookup(name)
    if known is None:
        raise ResolveError(f"unknown GPU {name!r}: not a catalogue id or nvidia-smi name")
    count = gpus if gpus is not None else found.gpu_count
    if count is None:
        raise ResolveError("the launch does not say how many GPUs a node gives it: give --gpus N")
    return {"gpu": known.id, "count": count, "nodes": nodes if nodes is not None else found.nodes or 1}
