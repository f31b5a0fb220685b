"""The agent's node checks (service/agent/gpus.py, weights.py, bootcheck.py): nvidia-smi outputs read into GPUs and an
interconnect, inventory drift, vLLM 0.33's free-memory check, and the weights record (manifest push) against the
weights on disk — hostile ones included: symlinks in a Hugging Face cache, odd files, unreadable directories."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess

import pytest

from service.agent import gpus as g
from service.agent import weights as w
from service.agent.bootcheck import claim_problem, run_checks
from service.domain.gpus import lookup
from service.domain.node_checks import hardware_claim, memory_claim
from tests.support.gpus import NVIDIA_SMI, install_nvidia_smi, observed, odd, sha256, weights_dir
from tests.support.live import PREFLIGHT

MIB, GIB = 1 << 20, 1 << 30
RLO = "\u202e"


def read(scenario: str, name: str) -> str:
    return (NVIDIA_SMI / scenario / name).read_text()


def hw_of(gpu_id: str, count: int, interconnect: str | None) -> dict:
    gpu = lookup(gpu_id)
    return hardware_claim(gpu_id=gpu.id, gpu=gpu.as_dict(), count=count, interconnect=interconnect)


# --- nvidia-smi ---------------------------------------------------------------------------------------------------


def test_eight_h100_sxm_with_nvlink():
    gpus = g.parse_gpus(read("h100-sxm-8", "gpus.csv"))
    assert [x.index for x in gpus] == list(range(8))
    assert {x.name for x in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert gpus[0].memory_total_bytes == 81559 * MIB and gpus[0].compute_capability == "9.0"
    assert gpus[7].bus_id == "00000000:DB:00.0"
    assert g.parse_interconnect(read("h100-sxm-8", "topo.txt"), 8) == "nvlink"
    facts = g.node_facts(gpus, "nvlink")
    assert (facts["gpu"], facts["gpu_count"], facts["interconnect"]) == ("h100-sxm-80gb", 8, "nvlink")


def test_four_a100_pcie_without_bridges_is_pcie():
    gpus = g.parse_gpus(read("a100-pcie-4", "gpus.csv"))
    assert len(gpus) == 4 and gpus[2].name == "NVIDIA A100 80GB PCIe"
    assert g.parse_interconnect(read("a100-pcie-4", "topo.txt"), 4) == "pcie"
    assert g.node_facts(gpus, "pcie")["gpu"] == "a100-pcie-80gb"  # nvidia-smi's name for it is in the catalogue


def test_one_l4_has_no_interconnect():
    gpus = g.parse_gpus(read("l4-1", "gpus.csv"))
    assert [(x.name, x.memory_total_bytes // MIB, x.compute_capability) for x in gpus] == [("NVIDIA L4", 23034, "8.9")]
    assert g.parse_interconnect(read("l4-1", "topo.txt"), 1) is None
    assert g.node_facts(gpus, None)["gpu"] == "l4-24gb"


def test_a_gpu_outside_the_catalogue_is_custom_with_its_reported_memory_and_capability():
    gpus = g.parse_gpus("0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887, 0, 12.0, 00000000:01:00.0\n")
    assert g.node_facts(gpus, None)["gpu"] == {
        "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "compute_capability": "12.0",
        "memory_bytes": 97887 * MIB,
    }


@pytest.mark.parametrize(
    "text",
    [
        "",
        "No devices were found\n",
        "index, name, memory.total [MiB]\n",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
        "0, NVIDIA H100, 81559, 0, 99.0, 00000000:18:00.0\n",
        "0, NVIDIA H100, -1, 0, 9.0, 00000000:18:00.0\n",
        "0, NVIDIA H100, [N/A], 0, 9.0, 00000000:18:00.0\n",
    ],
)
def test_what_is_not_a_gpu_list_is_refused(text):
    with pytest.raises(g.NvidiaSmiError):
        g.parse_gpus(text)


def test_a_partial_nvlink_mesh_is_pcie():
    topo = read("h100-sxm-8", "topo.txt").replace(
        "GPU3\tNV18\tNV18\tNV18\t X \tNV18", "GPU3\tNV18\tNV18\tNV18\t X \tSYS"
    )
    assert g.parse_interconnect(topo, 8) == "pcie"


# --- drift ----------------------------------------------------------------------------------------------------------


def test_the_same_gpus_do_not_drift():
    assert g.drift(g.parse_gpus(read("h100-sxm-8", "gpus.csv")), hw_of("h100-sxm-80gb", 8, "nvlink"), "nvlink") == []


def test_one_gpu_missing_is_drift_naming_the_count():
    d = g.drift(g.parse_gpus(read("h100-sxm-7-missing", "gpus.csv")), hw_of("h100-sxm-80gb", 8, "nvlink"), "nvlink")
    assert d == ["GPU count: the plan was validated for 8, nvidia-smi lists 7"]


def test_another_model_is_drift_naming_each_gpu():
    d = g.drift(g.parse_gpus(read("a100-pcie-4", "gpus.csv")), hw_of("h100-sxm-80gb", 4, "nvlink"), "pcie")
    assert (
        d[0]
        == "GPU 0 (00000000:17:00.0): model 'NVIDIA A100 80GB PCIe', the plan was validated for 'NVIDIA H100 SXM5 80GB'"
    )
    assert len(d) == 5 and d[-1] == "interconnect: the plan was validated for nvlink, nvidia-smi topo -m shows pcie"


def test_less_memory_than_validated_for_is_drift():
    custom = hardware_claim(
        gpu_id="custom", gpu={"name": "NVIDIA L4", "memory_bytes": 48 * GIB}, count=1, interconnect=None
    )
    assert g.drift(g.parse_gpus(read("l4-1", "gpus.csv")), custom, None) == [
        "GPU 0 (00000000:00:03.0): memory.total 23034 MiB, the plan was validated for 49152 MiB"
    ]


def test_a_marketed_memory_size_is_not_compared():
    a10g = g.parse_gpus("0, NVIDIA A10G, 23028, 0, 8.6, 00000000:00:1E.0\n")
    hw = hw_of("a10g-24gb", 1, None)
    assert hw["memory_checked"] is False and g.drift(a10g, hw, None) == []
    assert g.drift(a10g, {**hw, "memory_checked": True}, None) == [
        "GPU 0 (00000000:00:1E.0): memory.total 23028 MiB, the plan was validated for 24576 MiB"
    ]


# --- free memory (vllm 0.33.0 vllm/v1/worker/utils.py:716-772) ------------------------------------------------------


def mem(util=0.92, kv=None, weights=0, gpus=8):
    return {"gpu_memory_utilization": util, "kv_cache_memory_bytes": kv, "weights_bytes_per_gpu": weights, "gpus": gpus}


def test_a_foreign_process_holding_60_gib_is_a_shortfall_with_the_numbers_and_the_process():
    gpus = g.parse_gpus(read("h100-sxm-8-busy", "gpus.csv"))
    short = g.memory_shortfalls(gpus, mem(0.9))
    assert len(short) == 1 and short[0].gpu.index == 0
    assert short[0].needed_bytes == math.ceil(81559 * MIB * 0.9)  # as vLLM requests it (worker/utils.py:723)
    assert short[0].message() == (
        "GPU 0 (00000000:18:00.0): 19.64 GiB free of 79.65 GiB, the plan needs 71.68 GiB "
        "(gpu_memory_utilization 0.9 × 79.65 GiB total)"
    )
    procs = g.holders(g.parse_compute_apps(read("h100-sxm-8-busy", "apps.csv")), [short[0].gpu])
    assert procs == [
        {
            "pid": 48213,
            "process_name": "/usr/bin/python3",
            "used_memory_mib": 61440,
            "gpu": 0,
            "gpu_uuid": "GPU-5c3c8a9e-6b1d-4f0e-9a51-1c9b5f0c2e11",
        }
    ]


def test_a_launch_on_other_gpus_is_not_held_up_by_a_busy_gpu_0():
    gpus = g.parse_gpus(read("h100-sxm-8-busy", "gpus.csv"))
    used = g.gpus_used(gpus, mem(gpus=4), {"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert [x.index for x in used] == [4, 5, 6, 7] and g.memory_shortfalls(used, mem(0.9, gpus=4)) == []
    assert [x.index for x in g.gpus_used(gpus, mem(gpus=2), {})] == [0, 1]


def test_kv_cache_memory_bytes_needs_the_kv_cache_and_the_weights_free_too():
    gpus = g.parse_gpus(read("l4-1", "gpus.csv"))
    assert g.memory_shortfalls(gpus, mem(0.5, kv=4 * GIB, weights=8 * GIB, gpus=1)) == []
    short = g.memory_shortfalls(gpus, mem(0.5, kv=10 * GIB, weights=16 * GIB, gpus=1))
    assert short[0].needed_bytes == 26 * GIB and "kv_cache_memory_bytes 10.00 GiB + weights 16.00 GiB" in short[0].why


def test_memory_claim_counts_the_gpus_the_launch_uses():
    eff = {"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "gpu_memory_utilization": 0.85}
    assert memory_claim(
        effective=eff, budget={"weights_bytes_per_gpu": 5}, kv_cache_memory_bytes=None, gpus_used=4, gpus_per_node=8
    ) == {"gpu_memory_utilization": 0.85, "kv_cache_memory_bytes": None, "weights_bytes_per_gpu": 5, "gpus": 4}
    assert memory_claim(effective=eff, budget=None, kv_cache_memory_bytes=1, gpus_used=16, gpus_per_node=8)["gpus"] == 8


# --- weights --------------------------------------------------------------------------------------------------------


def test_describe_records_config_digest_tag_index_and_shards(tmp_path):
    d = weights_dir(tmp_path / "m", shards=3, tag="fp8")
    rec = w.describe(d, hash_shards=True)
    assert rec["config_sha256"] == sha256(d / "config.json") and rec["quantization"] == "fp8"
    assert rec["total_size"] == 3 * 4096 and rec["hf_quant_config_sha256"] is None
    assert [(s["name"], s["size"]) for s in rec["shards"]] == [
        (f"model-0000{i}-of-00003.safetensors", 4096) for i in (1, 2, 3)
    ]
    assert rec["shards"][1]["sha256"] == sha256(d / "model-00002-of-00003.safetensors")
    assert w.check(d, rec, verify_hashes=True) == []


def test_describe_without_an_index_records_every_top_level_safetensors_file(tmp_path):
    d = weights_dir(tmp_path / "m", shards=3)
    (d / "model.safetensors.index.json").unlink()
    (d / "original").mkdir()
    (d / "original" / "consolidated.safetensors").write_bytes(b"x")  # vLLM reads no subfolder
    rec = w.describe(d)
    assert rec["total_size"] is None
    assert [s["name"] for s in rec["shards"]] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    (d / "x\u202e.safetensors").write_bytes(b"x")
    with pytest.raises(w.WeightsError, match="bidirectional|invisible|control"):
        w.describe(d)


def test_a_wrong_tag_names_the_file_and_both_values(tmp_path):
    d = weights_dir(tmp_path / "m", tag="fp8")
    rec = w.describe(d)
    (d / "quantization.txt").write_text("awq\n")
    assert [m.message() for m in w.check(d, rec)] == [
        "quantization.txt: the manifest records tag fp8, the node has tag awq"
    ]


def test_a_config_from_another_revision(tmp_path):
    d = weights_dir(tmp_path / "m")
    rec = w.describe(d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "rope_theta": 10000.0}))
    [m] = w.check(d, rec)
    assert m.file == "config.json" and m.expected == f"sha256 {rec['config_sha256']}"
    assert m.found == f"sha256 {sha256(d / 'config.json')}"


def test_a_pre_sharded_copy_for_tp_2_misses_every_recorded_shard(tmp_path):
    rec = w.describe(weights_dir(tmp_path / "merged", shards=2))
    pre = tmp_path / "tp2"
    pre.mkdir()
    (pre / "config.json").write_bytes((tmp_path / "merged" / "config.json").read_bytes())
    for rank in (0, 1):  # vLLM's sharded_state layout: model-rank-R-part-P.safetensors
        (pre / f"model-rank-{rank}-part-0.safetensors").write_bytes(b"x" * 100)
    assert [(m.file, m.found) for m in w.check(pre, rec)] == [
        ("model-00001-of-00002.safetensors", "no such file"),
        ("model-00002-of-00002.safetensors", "no such file"),
    ]


def test_a_missing_and_a_short_shard(tmp_path):
    d = weights_dir(tmp_path / "m", shards=3)
    rec = w.describe(d)
    (d / "model-00001-of-00003.safetensors").unlink()
    with open(d / "model-00003-of-00003.safetensors", "r+b") as fh:
        fh.truncate(1000)  # an interrupted copy
    assert [m.message() for m in w.check(d, rec)] == [
        "model-00001-of-00003.safetensors: the manifest records 4096 bytes, the node has no such file",
        "model-00003-of-00003.safetensors: the manifest records 4096 bytes, the node has 1000 bytes",
    ]


def test_a_corrupted_shard_of_the_right_size_shows_only_with_hashes(tmp_path):
    d = weights_dir(tmp_path / "m", shards=2)
    rec = w.describe(d, hash_shards=True)
    (d / "model-00002-of-00002.safetensors").write_bytes(b"\xff" * 4096)
    assert w.check(d, rec) == []
    [m] = w.check(d, rec, verify_hashes=True)
    assert m.file == "model-00002-of-00002.safetensors" and m.found == f"sha256 {f'{sha256(d / m.file)}'}"


def test_a_shard_removed_while_the_directory_is_hashed_is_a_weights_error(tmp_path):
    d = weights_dir(tmp_path / "m", shards=2)
    second = d / "model-00002-of-00002.safetensors"
    with pytest.raises(w.WeightsError, match="model-00002-of-00002.safetensors went away"):
        w.describe(d, hash_shards=True, on_bytes=lambda n: second.unlink(missing_ok=True))  # while hashing shard 1


def test_a_recorded_shard_that_is_no_object_is_a_mismatch(tmp_path):
    d = weights_dir(tmp_path / "m", shards=1)
    [m] = w.check(d, {"config_sha256": sha256(d / "config.json"), "shards": ["model-00001-of-00001.safetensors"]})
    assert (m.file, m.expected) == ("None", "None bytes") and "not a plain file name" in m.found


@pytest.mark.parametrize(
    "name",
    [
        "../../etc/passwd",
        "/etc/passwd",
        "a/b.safetensors",
        "..",
        ".",
        "a\\b",
        "x\x00.safetensors",
        "x\n.safetensors",
        "",
        "a" * 256,
    ],
)
def test_path_traversal_and_weird_shard_names_are_refused(tmp_path, name):
    assert w.shard_name_problem(name) is not None
    d = weights_dir(tmp_path / "m", shards=1)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"]["evil"] = name
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(w.WeightsError, match="not a plain file name"):
        w.describe(d)
    [m] = w.check(d, {"config_sha256": sha256(d / "config.json"), "shards": [{"name": name, "size": 1}]})
    assert "not a plain file name" in m.found


def test_a_symlink_out_of_the_directory_and_a_fifo_are_refused_without_reading_them(tmp_path):
    d = weights_dir(tmp_path / "m", shards=2)
    rec = w.describe(d)
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 4096)
    (d / "model-00001-of-00002.safetensors").unlink()
    (d / "model-00001-of-00002.safetensors").symlink_to(secret)
    (d / "model-00002-of-00002.safetensors").unlink()
    os.mkfifo(d / "model-00002-of-00002.safetensors")  # reading it would block forever
    found = [m.found for m in w.check(d, rec, verify_hashes=True)]
    assert found[0].startswith("model-00001-of-00002.safetensors: a symlink to") and "outside" in found[0]
    assert found[1] == "model-00002-of-00002.safetensors: not a regular file"


def test_a_hugging_face_cache_snapshot_with_links_into_blobs_is_fine(tmp_path):
    repo = tmp_path / "models--meta-llama--Llama-3.1-8B"
    snap = weights_dir(repo / "snapshots" / "abc123", shards=2)
    (repo / "blobs").mkdir()
    for f in list(snap.iterdir()):
        blob = repo / "blobs" / sha256(f)
        f.rename(blob)
        f.symlink_to(os.path.relpath(blob, snap))
    rec = w.describe(snap, hash_shards=True)
    assert w.check(snap, rec, verify_hashes=True) == []


def test_a_huge_index_is_refused_before_it_is_parsed(tmp_path):
    d = weights_dir(tmp_path / "m", shards=1)
    with open(d / "model.safetensors.index.json", "wb") as fh:
        fh.truncate(w.MAX_INDEX + 1)  # sparse: no disk used
    with pytest.raises(w.WeightsError, match="more than"):
        w.describe(d)


def test_an_index_naming_too_many_shards_is_refused(tmp_path):
    d = weights_dir(tmp_path / "m", shards=1)
    index = {"weight_map": {f"t{i}": f"s{i}.safetensors" for i in range(w.MAX_SHARDS + 1)}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(w.WeightsError, match="more than 4096 shard files"):
        w.describe(d)


@pytest.mark.parametrize(
    "uri,expected",
    [
        ("/models/llama", "/models/llama"),
        ("s3://weights/llama-3.1-70b", "/srv/w/weights/llama-3.1-70b"),
        ("meta-llama/Llama-3.1-8B", "/srv/w/meta-llama/Llama-3.1-8B"),
    ],
)
def test_weights_root_maps_remote_uris(tmp_path, uri, expected):
    import pathlib

    assert str(w.local_directory(uri, pathlib.Path("/srv/w"))) == expected


def test_a_uri_that_would_leave_the_weights_root_is_refused():
    import pathlib

    with pytest.raises(w.WeightsError):
        w.local_directory("s3://bucket/../../etc", pathlib.Path("/srv/w"))
    assert w.local_directory("s3://bucket/x", None) is None


# --- the whole sequence, with the fake nvidia-smi --------------------------------------------------------------------


def claims_for(hw, memory, weights=None, uri="s3://x", env=None):
    nc = {"hardware": hw, "memory": memory, **({"weights": weights} if weights else {})}
    return {"jti": "p", "model_uri": uri, "env": env or {}, "node_checks": nc}


def test_run_checks_in_order_against_the_fake_nvidia_smi(tmp_path):
    smi = str(install_nvidia_smi(tmp_path / "bin", "h100-sxm-8"))
    lines = []
    d = weights_dir(tmp_path / "m", tag="fp8")
    ok = claims_for(hw_of("h100-sxm-80gb", 8, "nvlink"), mem(0.9), w.describe(d), uri=str(d))
    assert run_checks(ok, nvidia_smi=smi, weights_root=None, verify_hashes=False, say=lines.append) is None
    assert lines[0] == "GPUs: 8 × NVIDIA H100 80GB HBM3 as the plan was validated for"
    install_nvidia_smi(tmp_path / "bin", "h100-sxm-7-missing")
    r = run_checks(ok, nvidia_smi=smi, weights_root=None, verify_hashes=False, say=lines.append)
    assert (r.check, r.reason, r.details["differences"]) == (
        "gpus",
        "inventory_drift",
        ["GPU count: the plan was validated for 8, nvidia-smi lists 7"],
    )
    assert r.observed_facts["gpu_count"] == 7 and r.observed_facts["interconnect"] == "nvlink"
    install_nvidia_smi(tmp_path / "bin", "h100-sxm-8-busy")
    r = run_checks(ok, nvidia_smi=smi, weights_root=None, verify_hashes=False, say=lines.append)
    assert (r.check, r.reason) == ("gpu memory", "gpu_memory_busy")
    assert r.details["gpus"][0]["free_bytes"] == (81559 - 61443) * MIB
    assert "pid 48213 /usr/bin/python3 holds 61440 MiB on GPU 0" in r.message
    (d / "quantization.txt").write_text("awq\n")  # weights are checked before memory
    r = run_checks(ok, nvidia_smi=smi, weights_root=None, verify_hashes=False, say=lines.append)
    assert (r.reason, r.details["mismatches"]) == (
        "weights_mismatch",
        [{"file": "quantization.txt", "expected": "tag fp8", "found": "tag awq"}],
    )


def test_no_nvidia_smi_is_a_refusal_not_a_crash(tmp_path):
    r = run_checks(
        claims_for(hw_of("l4-24gb", 1, None), mem(gpus=1)),
        nvidia_smi=str(tmp_path / "nope"),
        weights_root=None,
        verify_hashes=False,
        say=lambda s: None,
    )
    assert (r.check, r.reason) == ("gpus", "nvidia_smi") and "not found" in r.message


def test_a_hanging_nvidia_smi_is_bounded(tmp_path, monkeypatch):
    slow = tmp_path / "nvidia-smi"
    slow.write_text("#!/bin/sh\nexec sleep 60\n")
    slow.chmod(0o755)
    with pytest.raises(g.NvidiaSmiError):
        g._run(str(slow), g.QUERY_GPUS, timeout=0.5)


@pytest.mark.parametrize(
    "nc",
    [
        None,
        {},
        {"hardware": {}, "memory": {}},
        {"hardware": {"gpu_id": "x", "count": 0, "memory_bytes": 1}, "memory": mem()},
        {"hardware": {"gpu_id": "x", "count": 1, "memory_bytes": 1}, "memory": mem(util=2)},
        {
            "hardware": {"gpu_id": "x", "count": 1, "memory_bytes": 1},
            "memory": mem(),
            "weights": {"shards": [{"name": "../x", "size": 1}]},
        },
    ],
)
def test_a_malformed_claim_is_refused(nc):
    assert claim_problem(nc) is not None


def test_observed_facts_leave_out_an_interconnect_that_could_not_be_read():
    gpus = observed("a100-pcie-4")
    assert "interconnect" not in g.node_facts(gpus, None)  # topo -m unreadable: the stored one stays
    assert g.node_facts(observed("l4-1"), None)["interconnect"] is None  # one GPU: none, said
    assert g.mixed_models(gpus) is None
    mixed = observed("h100-sxm-8")[:2] + observed("a100-pcie-4")[2:3]
    assert g.mixed_models(mixed) == (
        "the node mixes GPU models (GPU 0 is NVIDIA H100 80GB HBM3, GPU 2 is NVIDIA "
        "A100 80GB PCIe): Preflight validates a node as one GPU model"
    )


def test_agent_register_on_a_node_of_mixed_models_says_so_and_registers_nothing(tmp_path):
    scenario = tmp_path / "mixed"
    scenario.mkdir()
    h100 = (NVIDIA_SMI / "h100-sxm-8" / "gpus.csv").read_text().splitlines()[:2]
    a100 = (NVIDIA_SMI / "a100-pcie-4" / "gpus.csv").read_text().splitlines()[2:4]
    (scenario / "gpus.csv").write_text("\n".join(h100 + a100) + "\n")  # real lines: indices 0, 1, 2, 3
    (scenario / "topo.txt").write_text((NVIDIA_SMI / "a100-pcie-4" / "topo.txt").read_text())
    (scenario / "apps.csv").write_text("")
    fake = install_nvidia_smi(tmp_path / "bin", scenario)
    out = subprocess.run(
        [
            PREFLIGHT,
            "agent",
            "register",
            "--server",
            "http://127.0.0.1:9",
            "--node",
            "n",
            "--enroll-token",
            "e",
            "--token-file",
            str(tmp_path / "t"),
            "--nvidia-smi",
            str(fake),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert (
        "the node mixes GPU models (GPU 0 is NVIDIA H100 80GB HBM3, GPU 2 is NVIDIA A100 80GB PCIe)" in out.stderr
        and "nothing registered" in out.stderr
    )


def test_the_agent_refuses_a_shard_name_that_displays_as_another(tmp_path):
    d = weights_dir(tmp_path / "m", shards=1)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight"] = f"model-00001-of-00001{RLO}.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(w.WeightsError, match="U\\+202E"):
        w.describe(d)


def hf_cache(tmp_path) -> tuple[pathlib.Path, pathlib.Path]:
    repo = tmp_path / "hub" / "models--meta-llama--Llama-3.1-8B"
    snap = weights_dir(repo / "snapshots" / "5206a32e0bd3067aef1ce90f5528ade7d866253f", shards=2)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(snap.name)
    for p in list(snap.iterdir()):
        blob = repo / "blobs" / sha256(p)
        p.rename(blob)
        p.symlink_to(os.path.relpath(blob, snap))
    return repo, snap


def test_a_snapshot_linking_into_its_blobs_is_fine_even_by_an_absolute_link(tmp_path):
    repo, snap = hf_cache(tmp_path)
    shard = snap / "model-00001-of-00002.safetensors"
    blob = shard.resolve()
    shard.unlink()
    shard.symlink_to(blob)  # absolute, into the same blobs folder
    assert w.check(snap, w.describe(snap, hash_shards=True), verify_hashes=True) == []


@pytest.mark.parametrize(
    "target",
    [
        "../../refs/main",
        "../other-rev/model-00001-of-00002.safetensors",
        "../../blobs/../../../secret",
        "/ABS/secret",
        "../../blobs/not-a-sha",
        "../../../models--other--repo/blobs/" + "a" * 64,
    ],
)
def test_a_snapshot_link_anywhere_but_its_blobs_is_refused(tmp_path, target):
    repo, snap = hf_cache(tmp_path)
    rec = w.describe(snap)
    (tmp_path / "secret").write_bytes(b"s" * 4096)
    (repo / "snapshots" / "other-rev").mkdir()
    (repo / "snapshots" / "other-rev" / "model-00001-of-00002.safetensors").write_bytes(b"o" * 4096)
    (repo / "blobs" / "not-a-sha").write_bytes(b"n" * 4096)
    other = tmp_path / "hub" / "models--other--repo" / "blobs"
    other.mkdir(parents=True)
    (other / ("a" * 64)).write_bytes(b"a" * 4096)
    shard = snap / "model-00001-of-00002.safetensors"
    shard.unlink()
    shard.symlink_to(target.replace("/ABS", str(tmp_path)))
    [m] = w.check(snap, rec)
    assert m.file == shard.name and "a symlink to" in m.found and "nor a blob of its repository" in m.found
    with pytest.raises(w.WeightsError, match="nor a blob of its repository"):
        w.describe(snap)


def test_outside_a_snapshot_a_link_into_blobs_is_refused(tmp_path):
    repo, snap = hf_cache(tmp_path)
    plain = tmp_path / "plain"
    plain.mkdir()
    for p in snap.iterdir():
        (plain / p.name).symlink_to(p.resolve())  # a plain directory linking into someone's blobs
    with pytest.raises(w.WeightsError, match="outside the weights directory"):
        w.describe(plain)


KINDS = {
    "loop": "a symlink loop",
    "loop2": "a symlink loop",
    "dangling": "a dangling symlink (its target does not exist)",
    "directory": "a directory where a file is expected",
    "link-to-directory": "a directory where a file is expected",
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["config.json", "model-00002-of-00002.safetensors", "model.safetensors.index.json"])
def test_odd_files_are_refusals_naming_the_file(tmp_path, kind, name):
    d = weights_dir(tmp_path / "m", shards=2)
    rec = w.describe(d, hash_shards=True)
    odd(d, name, kind)
    with pytest.raises(w.WeightsError) as info:
        w.describe(d)
    assert str(info.value) == f"{name}: {KINDS[kind]}"
    found = {m.file: m.found for m in w.check(d, rec, verify_hashes=True)}
    if name != "model.safetensors.index.json":  # the check goes by the record, not the index
        assert found[name] == f"{name}: {KINDS[kind]}"


@pytest.mark.parametrize("kind", ["loop", "dangling", "file"])
def test_a_weights_directory_that_is_not_one_is_a_finding(tmp_path, kind):
    d = tmp_path / "m"
    if kind == "loop":
        d.symlink_to("m")
    elif kind == "dangling":
        d.symlink_to("nowhere")
    else:
        d.write_text("x")
    want = {"loop": "a symlink loop", "dangling": "no such directory", "file": "not a directory"}[kind]
    with pytest.raises(w.WeightsError, match=want):
        w.describe(d)
    assert [m.found for m in w.check(d, {"config_sha256": "0" * 64})] == [want]


def test_permission_denied_is_a_finding(tmp_path, monkeypatch):
    d = weights_dir(tmp_path / "m", shards=2)
    rec = w.describe(d, hash_shards=True)
    denied = str(d / "model-00002-of-00002.safetensors")
    real_open = os.open

    def guarded(path, flags, *a, **kw):  # root reads anything: the kernel's answer to another user, stood in
        if str(path) == denied:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr(w.os, "open", guarded)
    [m] = w.check(d, rec, verify_hashes=True)
    assert (m.file, m.found) == (
        "model-00002-of-00002.safetensors",
        "model-00002-of-00002.safetensors: permission denied",
    )
    with pytest.raises(w.WeightsError, match="permission denied"):
        w.describe(d, hash_shards=True)


def test_a_boot_check_on_a_looping_shard_is_a_weights_refusal(tmp_path):
    d = weights_dir(tmp_path / "m", shards=2)
    rec = w.describe(d)
    odd(d, "model-00001-of-00002.safetensors", "loop")
    fake = install_nvidia_smi(tmp_path / "bin", "l4-1")
    l4 = g.parse_gpus((NVIDIA_SMI / "l4-1" / "gpus.csv").read_text())[0]
    from service.domain.gpus import lookup
    from service.domain.node_checks import hardware_claim, memory_claim

    gpu = lookup("l4-24gb")
    claims = {
        "model_uri": str(d),
        "env": {},
        "argv": ["vllm", "serve", str(d)],
        "node_checks": {
            "hardware": hardware_claim(
                gpu_id=gpu.id, gpu={**gpu.as_dict(), "memory_bytes": l4.memory_total_bytes}, count=1, interconnect=None
            ),
            "memory": memory_claim(
                effective={"gpu_memory_utilization": 0.5},
                budget=None,
                kv_cache_memory_bytes=None,
                gpus_used=1,
                gpus_per_node=1,
            ),
            "weights": rec,
        },
    }
    said = []
    refusal = run_checks(claims, nvidia_smi=str(fake), weights_root=None, verify_hashes=False, say=said.append)
    assert refusal is not None and (refusal.check, refusal.reason) == ("weights", "weights_mismatch")
    assert refusal.details["mismatches"] == [
        {
            "file": "model-00001-of-00002.safetensors",
            "expected": "4096 bytes",
            "found": "model-00001-of-00002.safetensors: a symlink loop",
        }
    ]
