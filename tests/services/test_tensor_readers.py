"""service/tensor_readers.py: a checkpoint's inventory from a local directory, a Hugging Face cache snapshot, and a
Hub repository read by HTTP range from a Hub-compatible stand-in on 127.0.0.1 (no internet)."""

from __future__ import annotations

import http.server
import json
import os
import re
import threading
from collections.abc import Iterator

import pytest

from service.domain.tensors import TensorsError
from service.tensor_readers import read_directory, read_hub
from tests.support.safetensors_files import st_bytes, write_checkpoint

SHARD_1 = {
    "model.embed_tokens.weight": ("BF16", [256, 64]),
    "model.layers.0.self_attn.q_proj.weight": ("BF16", [64, 64]),
}
SHARD_2 = {"model.norm.weight": ("BF16", [64]), "lm_head.weight": ("BF16", [256, 64])}
SHARDS = {"model-00001-of-00002.safetensors": SHARD_1, "model-00002-of-00002.safetensors": SHARD_2}
BYTES = 2 * (256 * 64 + 64 * 64 + 64 + 256 * 64)


def test_local_directory_sharded(tmp_path):
    inv = read_directory(write_checkpoint(tmp_path / "m", SHARDS))
    assert inv.total_bytes == BYTES and len(inv.tensors) == 4
    assert inv.tensors["lm_head.weight"].file == "model-00002-of-00002.safetensors"
    assert [f.file for f in inv.files] == list(SHARDS)


def test_local_directory_without_index_reads_every_safetensors_file(tmp_path):
    d = write_checkpoint(tmp_path / "m", SHARDS, index=False)
    assert read_directory(d).total_bytes == BYTES


def test_local_directory_hostile(tmp_path):
    d = write_checkpoint(tmp_path / "m", SHARDS)
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(TensorsError, match="model-00002-of-00002.safetensors: .*not in"):
        read_directory(d)
    (d / "model-00002-of-00002.safetensors").symlink_to("/etc/hostname")
    with pytest.raises(TensorsError, match="outside the weights directory"):
        read_directory(d)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../x.safetensors"}}))
    with pytest.raises(TensorsError, match="not a plain file name"):
        read_directory(d)
    e = tmp_path / "empty"
    e.mkdir()
    with pytest.raises(TensorsError, match="not a safetensors checkpoint"):
        read_directory(e)
    with pytest.raises(TensorsError, match="no such directory"):
        read_directory(tmp_path / "nowhere")


def _hf_cache(tmp_path):
    """The layout huggingface_hub writes: snapshots/REV/file -> ../../blobs/SHA; returns the cache root."""
    repo = tmp_path / "hub" / "models--org--tiny"
    snap = repo / "snapshots" / ("a" * 40)
    write_checkpoint(tmp_path / "src", SHARDS)
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(os.listdir(tmp_path / "src"))):
        blob = repo / "blobs" / (f"{i:x}" * 64)[:64]
        blob.write_bytes((tmp_path / "src" / f).read_bytes())
        (snap / f).symlink_to(f"../../blobs/{blob.name}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    return tmp_path / "hub"


def test_hf_cache_snapshot_through_blob_symlinks(tmp_path):
    snap = _hf_cache(tmp_path) / "models--org--tiny" / "snapshots" / ("a" * 40)
    assert read_directory(snap).total_bytes == BYTES


class _Hub(http.server.BaseHTTPRequestHandler):
    """``/{owner}/{name}/resolve/{revision}/{file}`` with byte ranges, as the Hub serves files."""

    files: dict[str, bytes] = {}
    ranges: list[tuple[str, str | None]] = []

    def do_GET(self):  # noqa: N802
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", self.path)
        data = self.files.get(m.group(3)) if m and m.group(1) == "org/tiny" else None
        self.ranges.append((self.path.rsplit("/", 1)[-1], self.headers.get("Range")))
        if data is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        r = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        first, last = (int(r.group(1)), min(int(r.group(2)), len(data) - 1)) if r else (0, len(data) - 1)
        self.send_response(206 if r else 200)
        if r:
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        self.send_header("Content-Length", str(last - first + 1))
        self.end_headers()
        self.wfile.write(data[first : last + 1])

    def log_message(self, *args):
        pass


@pytest.fixture
def hub(monkeypatch) -> Iterator[type[_Hub]]:
    class Handler(_Hub):
        files = {name: st_bytes(t) for name, t in SHARDS.items()}
        ranges = []

    weight_map = {n: f for f, t in SHARDS.items() for n in t}
    Handler.files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}).encode()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_TOKEN", "")
    try:
        yield Handler
    finally:
        server.shutdown()
        server.server_close()


def test_hub_repository_read_by_range(hub, tmp_path):
    inv = read_hub("org/tiny")
    assert inv.layout_digest == read_directory(write_checkpoint(tmp_path / "m", SHARDS)).layout_digest
    assert inv.total_bytes == BYTES
    # only headers: the first 100 kB of each shard asked for, never the data behind it
    shard_reads = [r for f, r in hub.ranges if f.endswith("-of-00002.safetensors")]
    assert shard_reads == ["bytes=0-99999", "bytes=0-99999"]


def test_hub_single_file_and_missing_repo(hub):
    hub.files = {"model.safetensors": st_bytes(SHARD_2)}
    assert set(read_hub("org/tiny").tensors) == set(SHARD_2)
    with pytest.raises(TensorsError, match="org/other has no such file"):
        read_hub("org/other")


def test_hub_hostile_header(hub):
    hub.files = {"model.safetensors": (10**12).to_bytes(8, "little") + b"{}"}
    with pytest.raises(TensorsError, match="HeaderTooLarge"):
        read_hub("org/tiny")
    body = b'{"w": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}'
    hub.files = {"model.safetensors": len(body).to_bytes(8, "little") + body + b"\0" * 4}
    with pytest.raises(TensorsError, match="'w': ends at data offset 8, past the end of the file"):
        read_hub("org/tiny")


def test_hub_offline_reads_the_cache(monkeypatch, tmp_path, hub):
    cache = _hf_cache(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    assert read_hub("org/tiny").total_bytes == BYTES
    assert hub.ranges == []  # no request made
    with pytest.raises(TensorsError, match="offline .* not in the Hugging Face cache"):
        read_hub("org/absent")
