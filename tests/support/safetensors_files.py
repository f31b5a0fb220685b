"""Small real safetensors checkpoints written with the ``safetensors`` package (zeros for data: only the headers
matter to the inventory), and raw headers for what the package would never write."""

from __future__ import annotations

import ctypes
import json
import pathlib
import struct
from typing import Any

import safetensors

from service.domain.tensors import DTYPE_BITS

# the header dtype -> the name safetensors' TensorSpec takes (bindings/python/src/lib.rs, ``prepare``)
SPEC_DTYPE = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "bfloat16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "F64": "float64",
    "I64": "int64",
    "U64": "uint64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "F4": "float4_e2m1fn_x2",
}

Layout = dict[str, tuple[str, list[int]]]


def st_bytes(tensors: Layout, metadata: dict[str, str] | None = None) -> bytes:
    """A safetensors file holding ``tensors`` (name -> (header dtype, header shape)), data all zeros."""
    specs, keep = {}, []
    for name, (dtype, shape) in tensors.items():
        n = 1
        for d in shape:
            n *= d
        nbytes = n * DTYPE_BITS[dtype] // 8
        buf = ctypes.create_string_buffer(max(nbytes, 1))
        keep.append(buf)
        storage = list(shape[:-1]) + [shape[-1] // 2] if dtype == "F4" else list(shape)  # F4: two per byte
        specs[name] = safetensors.TensorSpec(
            dtype=SPEC_DTYPE[dtype], shape=storage, data_ptr=ctypes.addressof(buf), data_len=nbytes
        )
    return bytes(safetensors.serialize(specs, metadata=metadata or {"format": "pt"}))


def raw_header(header: Any, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A file with ``header`` (a dict, or bytes as they are) and ``data``; ``length`` overrides N."""
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(body) if length is None else length) + body + data


def write_checkpoint(
    directory: pathlib.Path,
    shards: dict[str, Layout],
    config: dict[str, Any] | None = None,
    *,
    index: bool | None = None,
    extra: dict[str, str] | None = None,
) -> pathlib.Path:
    """A model directory: config.json, every shard, the index when more than one shard (or ``index=True``),
    and ``extra`` files (``quantization.txt``, ``hf_quant_config.json``) as text."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config or {"architectures": ["LlamaForCausalLM"]}))
    weight_map = {}
    for file, tensors in shards.items():
        (directory / file).write_bytes(st_bytes(tensors))
        weight_map.update(dict.fromkeys(tensors, file))
    if index or (index is None and len(shards) > 1):
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
        )
    for name, text in (extra or {}).items():
        (directory / name).write_text(text)
    return directory
