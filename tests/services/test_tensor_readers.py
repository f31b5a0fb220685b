"""service/tensor_readers.py: a checkpoint's inventory from a local directory, a Hugging Face cache snapshot, and a
Hub repository read by HTTP range from a Hub-compatible stand-in on 127.0.0.1 (no internet)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest

from service.domain.tensors import TensorsError
from service.tensor_readers import _Hub, read_directory, read_hub, read_hub_checkpoint
from tests.support.hub import COMMIT, Hub, serve
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


@pytest.fixture
def hub(monkeypatch) -> Iterator[type[Hub]]:
    weight_map = {n: f for f, t in SHARDS.items() for n in t}
    files = {name: st_bytes(t) for name, t in SHARDS.items()}
    files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}).encode()
    with serve(files) as (handler, endpoint):
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_TOKEN", "")
        yield handler


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
    with pytest.raises(TensorsError, match="org/other .*HTTP 404 from .*: no such repository"):
        read_hub("org/other")


def test_hub_sharded_without_index_reads_every_top_level_safetensors_file(hub, tmp_path):
    """No index: every *.safetensors of the top folder, as vLLM globs them; a subfolder's are not read."""
    indexed = read_hub("org/tiny")
    hub.files = {name: st_bytes(t) for name, t in SHARDS.items()}
    hub.files["original/consolidated.safetensors"] = st_bytes(SHARD_2)  # vLLM reads no subfolder
    hub.files["config.json"] = b"{}"
    cp = read_hub_checkpoint("org/tiny")
    local = read_directory(write_checkpoint(tmp_path / "m", SHARDS, index=False))
    assert cp.inventory.layout_digest == indexed.layout_digest == local.layout_digest
    assert cp.inventory.summary() == indexed.summary() == local.summary()
    assert cp.index is None and cp.sizes == {name: len(st_bytes(t)) for name, t in SHARDS.items()}
    assert f"/api/models/org/tiny/tree/{COMMIT}?recursive=false&expand=false" in hub.requested
    assert not any("original" in p for p in hub.requested)
    hub.page = 1  # paged: one entry at a time, each next page linked
    assert read_hub("org/tiny").layout_digest == local.layout_digest


def _file(path: str) -> dict:
    return {"type": "file", "oid": "0" * 40, "size": 1, "path": path}


@pytest.mark.parametrize(
    ("listing", "page", "message"),
    [
        ([_file(f"f{i}.txt") for i in range(10**5)], 1000, "lists more than 10000 entries"),
        ([_file(f"f{i}.txt") for i in range(10**5)], 10**5, "lists more than 10000 entries"),
        ([_file(f"m{i}.safetensors") for i in range(5000)], 1000, "more than 4096 \\*.safetensors files"),
        ([_file("../x.safetensors")], 1000, "lists '../x.safetensors': name '..' is not a plain file name"),
        ([_file("a/../../x.safetensors")], 1000, "is not a plain file name"),
        ([_file("x\u202e.safetensors")], 1000, "x"),
        ([{"type": "file", "path": 7}], 1000, "an entry that is not a file or folder"),
        ({"files": []}, 1000, "not a JSON array of files"),
        ([_file("config.json")], 1000, "holds no model.safetensors.index.json and no \\*.safetensors file"),
    ],
)
def test_hub_hostile_file_list_refused(hub, listing, page, message):
    hub.files = {"config.json": b"{}", "model.safetensors": st_bytes(SHARD_2)}
    hub.listing, hub.page = listing, page
    with pytest.raises(TensorsError, match=message) as err:
        read_hub_checkpoint("org/tiny", timeout=20)
    assert err.value.file.startswith("org/tiny")
    assert not any(r.endswith(".safetensors") for r in hub.requested)  # refused before any header is read


def test_hub_file_list_next_page_elsewhere_refused(hub):
    hub.files = {"config.json": b"{}", "model.safetensors": st_bytes(SHARD_2)}
    hub.listing, hub.page = [_file("a.safetensors"), _file("b.safetensors")], 1
    hub.elsewhere = "http://other.example"
    with pytest.raises(TensorsError, match="next page is at other.example, not http://127.0.0.1"):
        read_hub_checkpoint("org/tiny")


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


# -- read_hub_checkpoint: what ``manifest push --hub`` registers, at one commit ---------------------------------------


def test_hub_checkpoint_pinned_to_the_commit_main_names(hub):
    hub.files = {**hub.files, "config.json": b'{"architectures": ["LlamaForCausalLM"]}', "quantization.txt": b"none\n"}
    cp = read_hub_checkpoint("org/tiny")
    assert cp.commit == COMMIT and set(cp.small) == {"config.json", "quantization.txt"}
    assert cp.sizes == {name: len(st_bytes(t)) for name, t in SHARDS.items()}
    assert cp.inventory.total_bytes == BYTES
    # config.json asked at main, everything after it at the commit main named (the branch may move meanwhile)
    paths = [p for p, _ in hub.ranges]
    assert paths[0] == "config.json" and len(paths) == 6
    assert hub.requested[0].startswith("/org/tiny/resolve/main/")
    assert all(f"/resolve/{COMMIT}/" in r for r in hub.requested[1:])


def test_hub_checkpoint_commit_checked(hub):
    hub.files = {**hub.files, "config.json": b"{}"}
    with pytest.raises(TensorsError, match=f"asked at commit {'1' * 40}, answered from {COMMIT}"):
        hub.revisions = {"1" * 40}
        read_hub_checkpoint("org/tiny", revision="1" * 40)
    hub.revisions, hub.commit = {"main", COMMIT}, None
    with pytest.raises(TensorsError, match="did not say which commit revision main is"):
        read_hub_checkpoint("org/tiny")
    assert read_hub_checkpoint("org/tiny", revision=COMMIT).commit == COMMIT  # a commit asked for is its own name
    hub.commit = "not-a-commit"
    with pytest.raises(TensorsError, match="config.json: the server names commit 'not-a-commit'"):
        read_hub_checkpoint("org/tiny")
    with pytest.raises(TensorsError, match="is not a repository id"):
        read_hub_checkpoint("org/../x")


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("huge", "org/tiny/config.json: 1000000000000 bytes, more than the 16777216 this file may have"),
        ("slow", "org/tiny/config.json: no complete answer from http://127.0.0.1:.* in 2 s"),
        ("drip", "org/tiny/config.json: no complete answer from .* in 2 s"),
        ("loop", "org/tiny/config.json: TooManyRedirects"),
    ],
)
def test_hub_hostile_answers_named_and_bounded(hub, how, message):
    hub.files = {**hub.files, "config.json": b"{}"}
    hub.hostile = {"config.json": how}
    started = time.monotonic()
    with pytest.raises(TensorsError, match=message):
        read_hub_checkpoint("org/tiny", timeout=2)
    assert time.monotonic() - started < 10


def test_hub_redirect_from_https_to_http_refused():
    import httpx

    chain = [httpx.Response(302, request=httpx.Request("GET", "https://hub.example/org/tiny/resolve/main/x"))]
    final = httpx.Response(200, request=httpx.Request("GET", "http://cdn.example/x"), history=chain)
    hub = _Hub.__new__(_Hub)
    hub.commit = None
    with pytest.raises(TensorsError, match="x: redirected from https to http://cdn.example: refused"):
        hub._check_chain(final, "x")
