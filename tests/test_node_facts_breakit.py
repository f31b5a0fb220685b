"""Hostile node facts and agent files, one kind per section: the agent's own files read without following a symlink and only
tokens of the service's shape; hardware facts that agree with themselves (and a PUT that merges the optional facts);
one display-text check for every name; the Hugging Face cache's symlink shape and nothing wider; whatever the disk
holds is a finding naming the file, never a traceback; the agent's console and help text."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess

import pytest
from typer.testing import CliRunner

from service.agent import files as f
from service.agent import gpus as g
from service.agent import weights as w
from service.agent.bootcheck import run_checks
from service.agent.client import AgentState, StateCorrupt
from service.agent.trust import Trust, TrustError
from service.agent.witness import read_kept
from service.domain.text import display_text_problem
from service.services.tokens import new_secret
from tests.support import model_config
from tests.support.gpus import NVIDIA_SMI, install_nvidia_smi, sha256, weights_dir

PREFLIGHT = str(pathlib.Path(__file__).parent.parent / ".venv" / "bin" / "preflight")


def observed(scenario: str) -> list[g.ObservedGpu]:
    return g.parse_gpus((NVIDIA_SMI / scenario / "gpus.csv").read_text())


def facts_of(scenario: str) -> dict:
    gpus = observed(scenario)
    return g.node_facts(gpus, g.parse_interconnect((NVIDIA_SMI / scenario / "topo.txt").read_text(), len(gpus)))


# --- 1. the agent's own files: no symlink, a regular file, bounded, a token of ours ----------------------------------

def test_the_token_pattern_is_the_one_the_service_issues():
    for _ in range(200):
        assert f.TOKEN_RE.fullmatch(new_secret())


def test_a_token_file_is_read_only_as_a_regular_file_of_ours(tmp_path):
    token = new_secret()
    real = tmp_path / "real.token"
    real.write_text(token + "\n")
    assert f.read_token_file(real) == token
    # a Kubernetes Secret mount: the file is a link into ..data/ — followed; what it ends at is still checked
    (tmp_path / "..data").mkdir()
    (tmp_path / "..data" / "token").write_text(token)
    link = tmp_path / "agent.token"
    link.symlink_to(tmp_path / "..data" / "token")
    assert f.read_token_file(link) == token
    (tmp_path / "..data" / "token").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    with pytest.raises(f.UnsafeFile, match="does not hold a Preflight token"):
        f.read_token_file(link)
    fifo_link = tmp_path / "fifo.token"
    fifo_link.symlink_to(tmp_path / "fifo")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(f.UnsafeFile, match="not a regular file"):
        f.read_token_file(fifo_link)  # opening it blocking would wait for a writer for ever
    with pytest.raises(f.UnsafeFile, match="not a regular file"):
        f.read_token_file(tmp_path / "fifo")
    with pytest.raises(f.UnsafeFile, match="is a directory"):
        f.read_token_file(tmp_path)
    with pytest.raises(FileNotFoundError):
        f.read_token_file(tmp_path / "missing")
    for text, why in [("x" * 5000, "more than the 4096"), ("hunter2", "does not hold a Preflight token"),
                      ("pf_" + "a" * 42, "does not hold a Preflight token"),
                      ("pf_" + "a" * 42 + "/", "does not hold a Preflight token"), ("", "is empty")]:
        real.write_text(text)
        with pytest.raises(f.UnsafeFile, match=why):
            f.read_token_file(real)
    real.write_bytes(b"pf_\xc3\xa9" + b"a" * 41)
    with pytest.raises(f.UnsafeFile, match="ASCII"):
        f.read_token_file(real)


def test_state_and_checkpoint_copies_are_never_read_through_a_symlink_the_trust_root_may_be_mounted(tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"last_seq": 7, "plan_id": None}))
    state = tmp_path / "state.json"
    state.symlink_to(elsewhere)
    with pytest.raises(StateCorrupt, match="symlink"):
        AgentState.load(state)
    trust = tmp_path / "trust.json"  # a ConfigMap mount: followed, and what it ends at is judged as a trust root
    trust.symlink_to(elsewhere)
    with pytest.raises(TrustError) as exc:
        Trust.load(trust)
    assert "symlink" not in str(exc.value)
    copy = tmp_path / "checkpoint.jws"
    copy.symlink_to(elsewhere)
    assert read_kept(copy, {"keys": []}) == (None, None)
    # set aside, the link itself moves (its target is untouched)
    aside = AgentState(path=state).set_aside()
    assert aside.is_symlink() and elsewhere.exists() and not os.path.lexists(state)


def test_agent_run_refuses_a_foreign_token_file_before_anything(tmp_path):
    real = tmp_path / "real.token"
    real.write_text(new_secret())
    link = tmp_path / "agent.token"
    link.symlink_to(real)
    args = ["agent", "run", "--server", "http://127.0.0.1:9", "--node", "n", "--trust", str(tmp_path / "t.json")]
    real.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")  # never sent as a bearer token, link or not
    for given in (real, link):
        out = subprocess.run([PREFLIGHT, *args, "--token-file", str(given)], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 2 and "does not hold a Preflight token" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr


def test_agent_register_refuses_a_symlinked_token_file_and_changes_nothing(tmp_path):
    fake = install_nvidia_smi(tmp_path / "bin", "l4-1")
    real = tmp_path / "real.token"
    token = new_secret()
    real.write_text(token)
    link = tmp_path / "agent.token"
    link.symlink_to(real)
    out = subprocess.run([PREFLIGHT, "agent", "register", "--server", "http://127.0.0.1:9", "--node", "n",
                          "--enroll-token", "e", "--token-file", str(link), "--nvidia-smi", str(fake)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "is a symlink: refused" in out.stderr and "nothing changed" in out.stderr
    assert link.is_symlink() and real.read_text() == token


# --- 2. hardware facts agree with themselves; optional facts merge -----------------------------------------------

def put(client, name, body):
    return client.put(f"/v1/nodes/{name}/facts", json=body)


def field_of(r) -> str:
    return r.json()["errors"][0]["field"]


def test_a_gpu_list_that_disagrees_with_the_facts_is_a_422_naming_the_field(client):
    h100 = facts_of("h100-sxm-8")
    r = put(client, "n1", {**h100, "gpu_count": 7})
    assert r.status_code == 422 and field_of(r) == "gpus" and "lists 8 GPU(s) but gpu_count is 7" in r.text
    mixed = {**h100, "gpus": h100["gpus"][:4] + [dict(x, index=4 + i) for i, x in
                                                  enumerate(facts_of("a100-pcie-4")["gpus"])]}
    r = put(client, "n1", mixed)
    assert r.status_code == 422 and field_of(r) == "gpus.4.name" and "mixes GPU models" in r.text
    r = put(client, "n1", {**h100, "gpu": "a100-sxm4-80gb"})  # the list says H100
    assert r.status_code == 422 and field_of(r) == "gpus.0.name" and "h100-sxm-80gb" in r.text
    r = put(client, "n1", {**h100, "gpus": [h100["gpus"][0]] * 8})
    assert r.status_code == 422 and field_of(r) == "gpus.1.index"
    assert client.get("/v1/nodes/n1").status_code == 404  # nothing written
    assert put(client, "n1", h100).status_code == 201


def test_omitted_optional_facts_stay_and_null_clears_them(client):
    h100 = facts_of("h100-sxm-8")
    assert put(client, "n2", {**h100, "address": "10.0.0.2"}).status_code == 201
    bare = {"gpu": h100["gpu"], "gpu_count": 8}  # interconnect, gpus and address left out
    r = put(client, "n2", bare)
    assert r.status_code == 200, r.text
    node = client.get("/v1/nodes/n2").json()
    assert (node["interconnect"], node["address"], len(node["gpus"])) == ("nvlink", "10.0.0.2", 8)
    kinds = [e["kind"] for e in client.get("/v1/audit", params={"node": "n2"}).json()["items"]]
    assert "node.facts_updated" not in kinds  # nothing changed
    r = put(client, "n2", {**bare, "interconnect": None, "address": None})
    assert r.status_code == 200
    node = client.get("/v1/nodes/n2").json()
    assert (node["interconnect"], node["address"], len(node["gpus"])) == (None, None, 8)
    # a new count with the stored per-GPU list left out: the kept list no longer agrees
    r = put(client, "n2", {**bare, "gpu_count": 7})
    assert r.status_code == 422 and field_of(r) == "gpus" and '"gpus": null' in r.json()["errors"][0]["message"]
    r = put(client, "n2", {**bare, "gpu_count": 7, "gpus": None})
    assert r.status_code == 200 and "gpus" not in client.get("/v1/nodes/n2").json()


def test_a_patched_gpu_count_clears_the_per_gpu_list_it_contradicts(client):
    assert put(client, "n3", facts_of("a100-pcie-4")).status_code == 201
    r = client.patch("/v1/nodes/n3", json={"gpu_count": 3})
    assert r.status_code == 200, r.text
    node = client.get("/v1/nodes/n3").json()
    assert node["gpu_count"] == 3 and "gpus" not in node


def test_observed_facts_leave_out_an_interconnect_that_could_not_be_read():
    gpus = observed("a100-pcie-4")
    assert "interconnect" not in g.node_facts(gpus, None)  # topo -m unreadable: the stored one stays
    assert g.node_facts(observed("l4-1"), None)["interconnect"] is None  # one GPU: none, said
    assert g.mixed_models(gpus) is None
    mixed = observed("h100-sxm-8")[:2] + observed("a100-pcie-4")[2:3]
    assert g.mixed_models(mixed) == ("the node mixes GPU models (GPU 0 is NVIDIA H100 80GB HBM3, GPU 2 is NVIDIA "
                                     "A100 80GB PCIe): Preflight validates a node as one GPU model")


def test_agent_register_on_a_node_of_mixed_models_says_so_and_registers_nothing(tmp_path):
    scenario = tmp_path / "mixed"
    scenario.mkdir()
    h100 = (NVIDIA_SMI / "h100-sxm-8" / "gpus.csv").read_text().splitlines()[:2]
    a100 = (NVIDIA_SMI / "a100-pcie-4" / "gpus.csv").read_text().splitlines()[2:4]
    (scenario / "gpus.csv").write_text("\n".join(h100 + a100) + "\n")  # real lines: indices 0, 1, 2, 3
    (scenario / "topo.txt").write_text((NVIDIA_SMI / "a100-pcie-4" / "topo.txt").read_text())
    (scenario / "apps.csv").write_text("")
    fake = install_nvidia_smi(tmp_path / "bin", scenario)
    out = subprocess.run([PREFLIGHT, "agent", "register", "--server", "http://127.0.0.1:9", "--node", "n",
                          "--enroll-token", "e", "--token-file", str(tmp_path / "t"), "--nvidia-smi", str(fake)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert ("the node mixes GPU models (GPU 0 is NVIDIA H100 80GB HBM3, GPU 2 is NVIDIA A100 80GB PCIe)"
            in out.stderr and "nothing registered" in out.stderr)


# --- 3. one display-text check for every name ------------------------------------------------------------------

REFUSED = ["\u202e", "\u202a", "\u2066", "\u200b", "\u200d", "\ufeff", "\u00ad", "\u0085", "\u2028", "\u2029",
           "\x07", "\x1b", "\x7f", "\ue000"]


@pytest.mark.parametrize("ch", REFUSED)
def test_control_and_invisible_characters_are_refused_by_the_one_check(ch):
    problem = display_text_problem(f"gpu{ch}-01")
    assert problem is not None and f"U+{ord(ch):04X}" in problem and "at position 3" in problem


@pytest.mark.parametrize("text", ["NVIDIA H100 80GB HBM3", "Llama-3.1-8B-Instruct", "équipe données", "機械学習-東京",
                                  "rack 12 🚀", "model-00001-of-00030.safetensors"])
def test_printable_text_in_any_script_passes(text):
    assert display_text_problem(text) is None


RLO = "\u202e"


def _bodies():
    l4 = facts_of("l4-1")
    gpu0 = l4["gpus"][0]
    cfg = model_config("meta-llama__Meta-Llama-3.1-8B")
    manifest = {"name": "m", "version": "1", "uri": "s3://m", "config": cfg}
    return [
        ("POST", "/v1/nodes", {"name": "x1", "gpu": "l4-24gb", "gpu_count": 1, "labels": {"rack": f"12{RLO}"}},
         "labels.rack"),
        ("POST", "/v1/nodes", {"name": "x2", "gpu": "l4-24gb", "gpu_count": 1, "labels": {f"ra\u200bck": "12"}},
         "labels"),
        ("PATCH", "/v1/nodes/gpu-a", {"labels": {"team": f"a{RLO}b"}}, "labels.team"),
        ("PUT", "/v1/nodes/x3/facts", {**l4, "gpus": [{**gpu0, "name": f"NVIDIA L4{RLO}"}]}, "gpus.0.name"),
        ("PUT", "/v1/nodes/x3/facts", {**l4, "gpus": [{**gpu0, "bus_id": "00000000:00:03.0\u200b"}]},
         "gpus.0.bus_id"),
        ("PUT", "/v1/nodes/x3/facts", {**l4, "gpu": f"NVIDIA L4{RLO}"}, "gpu"),
        ("PUT", "/v1/nodes/x3/facts", {**l4, "gpu": {"name": f"Acme{RLO}", "compute_capability": "9.0",
                                                     "memory_bytes": 80 << 30}}, "gpu"),
        ("POST", "/v1/manifests", {**manifest, "name": f"llama{RLO}"}, "name"),
        ("POST", "/v1/manifests", {**manifest, "uri": f"s3://m{RLO}"}, "uri"),
        ("POST", "/v1/manifests", {**manifest, "digests": {"config.json": f"abc\u2066"}}, "digests"),
        ("POST", "/v1/manifests", {**manifest, "files": {"config_sha256": "0" * 64, "shards": [
            {"name": f"model{RLO}.safetensors", "size": 1}]}}, "files.shards.0.name"),
        ("POST", "/v1/tokens", {"role": "auditor", "label": f"ops{RLO}"}, "label"),
        ("POST", "/v1/plans", {"manifest": "llama", "nodes": ["gpu-a"], "env": {"HF_HOME": f"/data{RLO}/x"}}, "env"),
        ("POST", "/v1/validate", {"model": {"config": cfg}, "hardware": {"gpu": {
            "name": f"Acme{RLO}", "compute_capability": "9.0", "memory_bytes": 80 << 30}}}, "hardware.gpu"),
    ]


@pytest.mark.parametrize("method,path,body,field", _bodies(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_name_with_a_bidi_or_invisible_character_is_a_422_naming_the_field(client, method, path, body, field):
    client.post("/v1/nodes", json={"name": "gpu-a", "gpu": "h100-sxm-80gb", "gpu_count": 8})
    client.post("/v1/manifests", json={"name": "llama", "version": "1", "uri": "s3://llama",
                                       "config": model_config("meta-llama__Meta-Llama-3.1-8B")})
    r = client.request(method, path, json=body)
    assert r.status_code == 422, r.text
    got = r.json()["errors"][0]["field"].replace("[", ".").replace("]", "")
    assert got.startswith(field), r.text
    assert "U+202E" in r.text or "U+200B" in r.text or "U+2066" in r.text


def test_the_agent_refuses_a_shard_name_that_displays_as_another(tmp_path):
    d = weights_dir(tmp_path / "m", shards=1)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight"] = f"model-00001-of-00001{RLO}.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(w.WeightsError, match="U\\+202E"):
        w.describe(d)


def test_engine_arguments_refuse_c1_controls_too(client):
    client.post("/v1/manifests", json={"name": "llama", "version": "1", "uri": "s3://llama",
                                       "config": model_config("meta-llama__Meta-Llama-3.1-8B")})
    client.post("/v1/nodes", json={"name": "gpu-a", "gpu": "h100-sxm-80gb", "gpu_count": 8})
    r = client.post("/v1/plans", json={"manifest": "llama", "nodes": ["gpu-a"],
                                       "engine_args": {"served_model_name": "llama\u009b31m"}})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "engine_args.served_model_name", r.text
    assert "U+009B" in r.text


# --- 4. the Hugging Face cache: snapshots/REV/file -> ../../blobs/SHA, and nothing wider -------------------------

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


@pytest.mark.parametrize("target", ["../../refs/main", "../other-rev/model-00001-of-00002.safetensors",
                                    "../../blobs/../../../secret", "/ABS/secret", "../../blobs/not-a-sha",
                                    "../../../models--other--repo/blobs/" + "a" * 64])
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


# --- 5. whatever the disk holds is a finding naming the file, never a traceback --------------------------------------

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


KINDS = {"loop": "a symlink loop", "loop2": "a symlink loop",
         "dangling": "a dangling symlink (its target does not exist)",
         "directory": "a directory where a file is expected", "link-to-directory": "a directory where a file is expected"}


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
    assert (m.file, m.found) == ("model-00002-of-00002.safetensors",
                                 "model-00002-of-00002.safetensors: permission denied")
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
    claims = {"model_uri": str(d), "env": {}, "argv": ["vllm", "serve", str(d)], "node_checks": {
        "hardware": hardware_claim(gpu_id=gpu.id, gpu={**gpu.as_dict(), "memory_bytes": l4.memory_total_bytes},
                                   count=1, interconnect=None),
        "memory": memory_claim(effective={"gpu_memory_utilization": 0.5}, budget=None, kv_cache_memory_bytes=None,
                               gpus_used=1, gpus_per_node=1), "weights": rec}}
    said = []
    refusal = run_checks(claims, nvidia_smi=str(fake), weights_root=None, verify_hashes=False, say=said.append)
    assert refusal is not None and (refusal.check, refusal.reason) == ("weights", "weights_mismatch")
    assert refusal.details["mismatches"] == [{"file": "model-00001-of-00002.safetensors", "expected": "4096 bytes",
                                              "found": "model-00001-of-00002.safetensors: a symlink loop"}]


def test_manifest_push_of_an_odd_directory_says_which_file(tmp_path):
    d = weights_dir(tmp_path / "m", shards=2)
    odd(d, "model-00002-of-00002.safetensors", "dangling")
    out = subprocess.run([PREFLIGHT, "manifest", "push", str(d), "--server", "http://127.0.0.1:9", "--token", "t"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "model-00002-of-00002.safetensors: a dangling symlink" in out.stderr


def test_a_fifo_config_never_blocks_manifest_push(tmp_path):
    d = weights_dir(tmp_path / "m", shards=1)
    (d / "config.json").unlink()
    os.mkfifo(d / "config.json")
    out = subprocess.run([PREFLIGHT, "manifest", "push", str(d), "--server", "http://127.0.0.1:9", "--token", "t"],
                         capture_output=True, text=True, timeout=60)  # a blocking open would time out here
    assert out.returncode == 2 and "config.json: not a regular file" in out.stderr


# --- 6. the agent's console and help --------------------------------------------------------------------------------

def test_set_aside_names_why_and_never_overwrites(tmp_path):
    state = tmp_path / "state.json"
    names = []
    for why in ("reset", "reset", "corrupt"):
        state.write_text("{}")
        names.append(AgentState(path=state).set_aside(why).name)
    assert re.fullmatch(r"state\.json\.reset-\d{8}T\d{6}Z", names[0])
    assert names[1] != names[0] and names[1].startswith("state.json.reset-")
    assert names[2].startswith("state.json.corrupt-")
    assert len(list(tmp_path.iterdir())) == 3


def test_every_command_help_is_paragraphs_and_the_agent_lists_one_line_each():
    import typer

    from service.cli import app

    group = typer.main.get_command(app)

    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield path, cmd

    seen = 0
    for path, cmd in walk(group, []):
        seen += 1
        paragraphs = (cmd.help or "").split("\n\n")
        assert all("\n" not in p for p in paragraphs), (path, cmd.help)
        if path[0] == "agent":
            assert len(paragraphs[0]) <= 100, (path, paragraphs[0])
    assert seen >= 20
    out = CliRunner().invoke(app, ["agent", "--help"])
    assert out.exit_code == 0 and "Boot this node's current plan: verify it, check the node" in out.output
