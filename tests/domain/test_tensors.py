"""service/domain/tensors.py: safetensors headers read as the format defines them, hostile ones refused quickly."""

from __future__ import annotations

import hashlib
import io
import json
import struct

import pytest

from service.domain.tensors import (
    MAX_HEADER_BYTES,
    TensorsError,
    build_inventory,
    layout_digest,
    parse_header,
    parse_index,
    read_header,
)
from tests.support.safetensors_files import raw_header, st_bytes

LLAMA_LAYER = {
    "model.embed_tokens.weight": ("BF16", [128, 64]),
    "model.layers.0.self_attn.q_proj.weight": ("BF16", [64, 64]),
    "model.layers.0.input_layernorm.weight": ("BF16", [64]),
    "lm_head.weight": ("BF16", [128, 64]),
}


def test_a_real_file_reads_as_written():
    data = st_bytes(LLAMA_LAYER, {"format": "pt"})
    header = parse_header(data, "model.safetensors", file_size=len(data))
    assert {t.name: (t.dtype, list(t.shape)) for t in header.tensors} == LLAMA_LAYER
    assert header.metadata == {"format": "pt"}
    assert header.data_bytes == 2 * (128 * 64 + 64 * 64 + 64 + 128 * 64)
    assert len(data) == 8 + header.header_bytes + header.data_bytes
    again = read_header(io.BytesIO(data), "model.safetensors", file_size=len(data))
    assert again == header
    inv = build_inventory([header])
    assert inv.total_bytes == header.data_bytes
    assert inv.by_dtype["BF16"].tensors == 4
    assert list(inv.tensors) == sorted(LLAMA_LAYER)


def test_layout_digest_canonical_bytes():
    """The digest is the docstring's byte form, exactly (the node agent recomputes it)."""
    q = struct.Struct("<Q").pack
    want = hashlib.sha256(
        b"preflight-safetensors-layout/1\n"
        + q(1) + b"a" + q(4) + b"BF16" + q(2) + q(2) + q(3)
        + q(1) + b"b" + q(2) + b"U8" + q(0)
    ).hexdigest()  # fmt: skip
    assert layout_digest([("b", "U8", []), ("a", "BF16", [2, 3])]) == "sha256:" + want


def test_layout_digest_ignores_files_and_offsets_but_not_shapes():
    one = build_inventory([parse_header(st_bytes(LLAMA_LAYER), "model.safetensors")])
    names = sorted(LLAMA_LAYER)
    a = st_bytes({n: LLAMA_LAYER[n] for n in names[:2]})
    b = st_bytes({n: LLAMA_LAYER[n] for n in names[2:]})
    two = build_inventory([parse_header(a, "model-00001-of-00002.safetensors"), parse_header(b, "m2.safetensors")])
    assert one.layout_digest == two.layout_digest
    changed = dict(LLAMA_LAYER, **{"lm_head.weight": ("BF16", [129, 64])})
    assert build_inventory([parse_header(st_bytes(changed), "m")]).layout_digest != one.layout_digest
    changed = dict(LLAMA_LAYER, **{"lm_head.weight": ("F16", [128, 64])})
    assert build_inventory([parse_header(st_bytes(changed), "m")]).layout_digest != one.layout_digest


def _refused(data: bytes, file_size: int | None = None) -> TensorsError:
    with pytest.raises(TensorsError) as info:
        parse_header(data, "model-00003-of-00009.safetensors", file_size=file_size)
    assert "model-00003-of-00009.safetensors" in str(info.value)
    return info.value


def test_huge_header_length_refused_unread():
    err = _refused(struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}")
    assert "100000000" in err.message and "HeaderTooLarge" in err.message
    err = _refused(struct.pack("<Q", 2**64 - 1))
    assert "header length" in err.message
    # a length within the bound but past the file's end: refused before reading (a file object, not bytes)
    with pytest.raises(TensorsError, match="past the end of the file"):
        read_header(io.BytesIO(struct.pack("<Q", 1000) + b"{}"), "m.safetensors", file_size=10)
    with pytest.raises(TensorsError, match="too short"):
        parse_header(b"\x01\x00", "m.safetensors")


def test_non_json_and_duplicate_keys_refused():
    assert "not JSON" in _refused(raw_header(b"{not json")).message
    assert "not UTF-8" in _refused(raw_header(b'{"\xff": 1}')).message
    assert "not a JSON object" in _refused(raw_header(b"[1, 2]")).message
    assert "nests too deeply" in _refused(raw_header(b"[" * 100_000)).message
    dup = b'{"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}'
    err = _refused(raw_header(dup, b"\0\0"))
    assert err.tensor == "w" and "twice" in err.message


def test_entries_checked_against_the_format():
    def one(entry: dict) -> TensorsError:
        return _refused(raw_header({"model.layers.7.mlp.down_proj.weight": entry}, b"\0" * 64))

    ok = {"dtype": "BF16", "shape": [4, 8], "data_offsets": [0, 64]}
    assert parse_header(raw_header({"w": ok}, b"\0" * 64), "m").tensors[0].nbytes == 64
    err = one({**ok, "dtype": "FP8"})
    assert err.tensor == "model.layers.7.mlp.down_proj.weight" and "'FP8' is not a safetensors dtype" in err.message
    assert "non-negative integers" in one({**ok, "shape": [4, -8]}).message
    assert "non-negative integers" in one({**ok, "shape": [4, True]}).message
    assert "non-negative integers" in one({**ok, "shape": [4, 8.0]}).message
    assert "is 64 bytes" in one({**ok, "data_offsets": [0, 32]}).message
    assert "[begin, end]" in one({**ok, "data_offsets": [0]}).message
    assert "whole number of bytes" in one({"dtype": "F4", "shape": [3], "data_offsets": [0, 1]}).message
    assert "at most 1024" in _refused(raw_header({"x" * 2000: ok}, b"\0" * 64)).message
    assert "lone surrogate" in _refused(raw_header(b'{"\\ud800": {}}')).message
    assert "__metadata__" in _refused(raw_header({"__metadata__": {"a": 1}})).message


def test_overlapping_gapped_and_out_of_file_offsets_refused():
    a = {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}
    b = {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}
    err = _refused(raw_header({"a": a, "b": b}, b"\0" * 12))
    assert err.tensor == "b" and "inside 'a'" in err.message
    c = {"dtype": "U8", "shape": [8], "data_offsets": [10, 18]}
    err = _refused(raw_header({"a": a, "c": c}, b"\0" * 18))
    assert err.tensor == "c" and "a gap of 2 bytes" in err.message
    data = raw_header({"a": a}, b"\0" * 4)
    err = _refused(data, file_size=len(data))
    assert err.tensor == "a" and "past the end of the file" in err.message
    data = raw_header({"a": a}, b"\0" * 9)
    assert "covered by none" in _refused(data, file_size=len(data)).message


def test_a_million_tensors_refused_fast():
    entry = b'"t%d": {"dtype": "U8", "shape": [1], "data_offsets": [%d, %d]}'
    body = b"{" + b",".join(entry % (i, i, i + 1) for i in range(1_000_000)) + b"}"
    assert len(body) < MAX_HEADER_BYTES
    err = _refused(raw_header(body))  # counted before the JSON is parsed (no timing asserted: bench/ measures)
    assert "more than 500000" in err.message and "refused unread" in err.message


def test_a_tensor_in_two_files_and_index_disagreement_refused():
    a = parse_header(st_bytes({"w": ("U8", [2])}), "a.safetensors")
    b = parse_header(st_bytes({"w": ("U8", [2])}), "b.safetensors")
    with pytest.raises(TensorsError, match="is also in a.safetensors"):
        build_inventory([a, b])
    index = parse_index(json.dumps({"weight_map": {"w": "b.safetensors"}}).encode())
    with pytest.raises(TensorsError, match="weight_map says it is in b.safetensors"):
        build_inventory([a], index)


def test_index_parsed_and_bounded():
    raw = json.dumps(
        {
            "metadata": {"total_size": 4},
            "weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors", "c": "m-1.safetensors"},
        }
    ).encode()
    index = parse_index(raw)
    assert index.files == ("m-1.safetensors", "m-2.safetensors") and index.total_size == 4
    with pytest.raises(TensorsError, match="no weight_map"):
        parse_index(b'{"metadata": {}}')
    with pytest.raises(TensorsError, match="names no file"):
        parse_index(b'{"weight_map": {"a": 3}}')
    with pytest.raises(TensorsError, match="twice"):
        parse_index(b'{"weight_map": {"a": "x", "a": "y"}}')


def test_hostile_headers_found_by_review_are_named_not_raised():
    """A dtype that is no string, a duplicate field inside one tensor's entry, and a header of entries that are no
    objects (refused before the JSON is parsed, whatever its size)."""
    err = _refused(raw_header({"a": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4))
    assert err.tensor == "a" and "dtype" in err.message
    dup = b'{"w": {"dtype": "U8", "dtype": "F16", "shape": [1], "data_offsets": [0, 1]}}'
    err = _refused(raw_header(dup, b"\0"))
    assert err.tensor is None and "'dtype' appears twice" in err.message
    loose = b"{" + b",".join(b'"%d":0' % i for i in range(200_000)) + b"}"
    assert "refused unread" in _refused(raw_header(loose)).message
