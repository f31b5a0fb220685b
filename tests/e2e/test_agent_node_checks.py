"""End to end: the real CLI (`preflight agent register`, `preflight manifest push`, `preflight agent run
--exec`) against a live uvicorn, with a stand-in vllm and a fake nvidia-smi replaying real outputs on PATH. A node
goes from bare metal to running its plan with an enrollment token alone; no launch starts on GPUs or weights that
differ from what the plan was validated against, and each refusal reaches the service and the audit."""

from __future__ import annotations

import os
import stat
import subprocess

import httpx
import pytest

from tests.support.agent_node import FAKE_VLLM
from tests.support.gpus import install_nvidia_smi, weights_dir
from tests.support.live import PREFLIGHT, PY, admin


class BareNode:
    """A node with nothing but the preflight CLI, a vllm, nvidia-smi and its weights."""

    def __init__(self, tmp_path, url, scenario="h100-sxm-8", name="gpu-01"):
        self.url, self.name, self.dir = url, name, tmp_path / f"node-{name}"
        self.bin = self.dir / "bin"
        self.bin.mkdir(parents=True)
        (self.bin / "vllm").write_text(FAKE_VLLM.format(py=PY))
        (self.bin / "vllm").chmod(0o755)
        install_nvidia_smi(self.bin, scenario)
        self.log, self.state, self.trust = self.dir / "vllm.log", self.dir / "state.json", self.dir / "trust.json"
        self.token_file = self.dir / "agent.token"
        self.trust.write_text(httpx.get(f"{url}/.well-known/jwks.json").text)  # provisioning

    def env(self):
        return {
            **os.environ,
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "FAKE_VLLM_LOG": str(self.log),
            "PREFLIGHT_DATA_DIR": str(self.dir / "var"),
        }

    def cli(self, *args, timeout=60):
        return subprocess.run([PREFLIGHT, *args], env=self.env(), capture_output=True, text=True, timeout=timeout)

    def register(self, enroll_token, *more):
        return self.cli(
            "agent",
            "register",
            "--server",
            self.url,
            "--node",
            self.name,
            "--enroll-token",
            enroll_token,
            "--token-file",
            str(self.token_file),
            *more,
        )

    def boot(self, *more):
        return self.cli(
            "agent",
            "run",
            "--server",
            self.url,
            "--node",
            self.name,
            "--token-file",
            str(self.token_file),
            "--state",
            str(self.state),
            "--trust",
            str(self.trust),
            "--exec",
            *more,
        )

    def launches(self):
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture
def world(servers, tmp_path):
    (url,) = servers(1)
    c = admin(url)
    enroll = c.post("/v1/tokens", json={"role": "enroller", "label": "rack 12 rollout"}).json()["token"]
    node = BareNode(tmp_path, url)
    weights = weights_dir(tmp_path / "weights" / "llama-3.1-8b", shards=4, tag="none")
    push = node.cli(
        "manifest",
        "push",
        str(weights),
        "--server",
        url,
        "--token",
        c.headers["Authorization"][7:],
        "--name",
        "meta-llama/Llama-3.1-8B",
        "--version",
        "1",
        "--hash-shards",
    )
    assert push.returncode == 0, push.stderr
    return url, c, enroll, node, weights


def refusals(c):
    return [
        e["payload"] for e in c.get("/v1/audit", params={"node": "gpu-01", "kind": "agent.refused"}).json()["items"]
    ]


PLAN = {
    "manifest": "meta-llama/Llama-3.1-8B",
    "nodes": ["gpu-01"],
    "engine_args": {"tensor_parallel_size": 8, "max_model_len": 8192, "gpu_memory_utilization": 0.9},
}


def test_bare_metal_to_running_with_an_enrollment_token_alone(world):
    url, c, enroll, node, weights = world
    reg = node.register(enroll, "--address", "10.0.12.7")
    assert reg.returncode == 0, reg.stderr
    assert reg.stdout.startswith(
        "registered gpu-01: 8 × NVIDIA H100 SXM5 80GB (h100-sxm-80gb), 81559 MiB, "
        "interconnect nvlink; agent token written to "
    )
    assert stat.S_IMODE(node.token_file.stat().st_mode) == 0o600
    token = node.token_file.read_text().strip()
    assert token.startswith("pf_") and token not in reg.stdout + reg.stderr  # shown nowhere else
    facts = c.get("/v1/nodes/gpu-01").json()
    assert (facts["gpu"]["id"], facts["gpu_count"], facts["interconnect"]) == ("h100-sxm-80gb", 8, "nvlink")
    assert (
        facts["address"] == "10.0.12.7" and facts["labels"] == {} and facts["gpus"][7]["bus_id"] == "00000000:DB:00.0"
    )
    # The enroller can do nothing else
    e = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {enroll}"})
    assert e.post("/v1/plans", json=PLAN).status_code == 403
    assert e.get("/v1/nodes/gpu-01/plan").status_code == 403
    # the manifest recorded the weights (hashes too)
    files = c.get("/v1/manifests/meta-llama/Llama-3.1-8B@1").json()["files"]
    assert (
        files["quantization"] is None
        and len(files["shards"]) == 4
        and all(len(s["sha256"]) == 64 for s in files["shards"])
    )
    plan = c.post("/v1/plans", json=PLAN)
    assert plan.status_code == 201, plan.text
    plan = plan.json()
    run = node.boot("--verify-hashes")
    assert run.returncode == 0, run.stderr
    assert node.launches() == [" ".join(plan["argv"][1:])]
    assert "GPUs: 8 × NVIDIA H100 80GB HBM3 as the plan was validated for" in run.stderr
    assert f"weights: {weights} matches the manifest (4 shards, hashes verified)" in run.stderr
    assert "GPU memory: 8 GPU(s) with the memory vLLM will request free" in run.stderr
    # re-running register is safe: the same facts, the token kept (and still the node's)
    again = node.register(enroll, "--address", "10.0.12.7")
    assert again.returncode == 0 and again.stdout.startswith("updated gpu-01") and "kept in" in again.stdout
    assert node.token_file.read_text().strip() == token
    assert node.boot().returncode == 0
    kinds = [ev["kind"] for ev in c.get("/v1/audit", params={"node": "gpu-01"}).json()["items"]]
    assert kinds.count("node.registered") == 1 and "node.facts_updated" not in kinds
    # --rotate-token: a new token in the file, the old one dead
    rot = node.register(enroll, "--rotate-token")
    assert rot.returncode == 0 and node.token_file.read_text().strip() != token
    assert httpx.get(f"{url}/v1/nodes/gpu-01/plan", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    assert node.boot().returncode == 0


def test_a_gpu_missing_at_boot_is_refused_reported_and_the_facts_updated(world):
    url, c, enroll, node, _ = world
    assert node.register(enroll).returncode == 0
    plan = c.post("/v1/plans", json=PLAN).json()
    install_nvidia_smi(node.bin, "h100-sxm-7-missing")  # a GPU fell off the bus since
    run = node.boot()
    assert run.returncode == 3 and node.launches() == []
    assert (
        f"preflight agent: REFUSED gpus {plan['id']}: the node's GPUs differ from the hardware the plan was "
        f"validated for: GPU count: the plan was validated for 8, nvidia-smi lists 7. vLLM was not started."
    ) in run.stderr
    [r] = refusals(c)
    assert r["status"] == "refused" and r["details"]["reason"] == "inventory_drift"
    assert r["details"]["differences"] == ["GPU count: the plan was validated for 8, nvidia-smi lists 7"]
    node_now = c.get("/v1/nodes/gpu-01").json()
    assert node_now["gpu_count"] == 7 and len(node_now["gpus"]) == 7
    [upd] = c.get("/v1/audit", params={"node": "gpu-01", "kind": "node.facts_updated"}).json()["items"]
    assert upd["actor"] == "agent:gpu-01" and upd["payload"]["before"]["gpu_count"] == 8
    # the operator's next plan is judged against the 7 GPUs: TP 8 no longer fits the node
    assert c.post("/v1/plans", json=PLAN).status_code == 422
    # the GPU comes back (reseated): the plan still holds, the boot runs it, and the facts count 8 again
    install_nvidia_smi(node.bin, "h100-sxm-8")
    back = node.boot()
    assert back.returncode == 0 and len(node.launches()) == 1, back.stderr
    assert "the GPUs are back: the node's facts are updated with what nvidia-smi shows" in back.stderr
    restored = c.get("/v1/nodes/gpu-01").json()
    assert restored["gpu_count"] == 8 and len(restored["gpus"]) == 8
    assert c.post("/v1/plans", json=PLAN).status_code == 201
    again = node.boot()  # nothing drifted since: the facts are not sent again
    assert again.returncode == 0 and "the GPUs are back" not in again.stderr
    assert len(c.get("/v1/audit", params={"node": "gpu-01", "kind": "node.facts_updated"}).json()["items"]) == 2


def test_a_foreign_process_holding_60_gb_is_refused_with_the_numbers_and_the_process(world):
    url, c, enroll, node, _ = world
    assert node.register(enroll).returncode == 0
    c.post("/v1/plans", json=PLAN)
    install_nvidia_smi(node.bin, "h100-sxm-8-busy")
    run = node.boot()
    assert run.returncode == 3 and node.launches() == []
    assert (
        "GPU 0 (00000000:18:00.0): 19.64 GiB free of 79.65 GiB, the plan needs 71.68 GiB "
        "(gpu_memory_utilization 0.9 × 79.65 GiB total)"
    ) in run.stderr
    assert "pid 48213 /usr/bin/python3 holds 61440 MiB on GPU 0" in run.stderr
    [r] = refusals(c)
    d = r["details"]
    assert (d["reason"], d["check"]) == ("gpu_memory_busy", "gpu memory")
    assert d["gpus"][0]["free_bytes"] == (81559 - 61443) << 20 and d["processes"][0]["pid"] == 48213
    assert c.get("/v1/nodes/gpu-01").json()["gpu_count"] == 8  # not drift: the facts stay
    install_nvidia_smi(node.bin, "h100-sxm-8")  # the process went away: the next start (systemd's retry) runs
    assert node.boot().returncode == 0 and len(node.launches()) == 1


@pytest.mark.parametrize(
    "damage,file,expected,found",
    [
        (lambda w: (w / "quantization.txt").write_text("awq\n"), "quantization.txt", "no tag", "tag awq"),
        (
            lambda w: (w / "model-00002-of-00004.safetensors").unlink(),
            "model-00002-of-00004.safetensors",
            "4096 bytes",
            "no such file",
        ),
        (
            lambda w: os.truncate(w / "model-00004-of-00004.safetensors", 100),
            "model-00004-of-00004.safetensors",
            "4096 bytes",
            "100 bytes",
        ),
    ],
    ids=["wrong-tag", "missing-shard", "short-shard"],
)
def test_weights_that_are_not_the_manifests_are_refused_before_vllm_starts(world, damage, file, expected, found):
    url, c, enroll, node, weights = world
    assert node.register(enroll).returncode == 0
    c.post("/v1/plans", json=PLAN)
    damage(weights)
    run = node.boot()
    assert run.returncode == 3 and node.launches() == []
    assert f"{file}: the manifest records {expected}, the node has {found}" in run.stderr
    [r] = refusals(c)
    assert r["details"]["reason"] == "weights_mismatch"
    assert {"file": file, "expected": expected, "found": found} in r["details"]["mismatches"]


def test_a_remote_uri_is_checked_under_weights_root(world, tmp_path):
    url, c, enroll, node, weights = world
    assert node.register(enroll).returncode == 0
    push = node.cli(
        "manifest",
        "push",
        str(weights),
        "--server",
        url,
        "--token",
        c.headers["Authorization"][7:],
        "--name",
        "meta-llama/Llama-3.1-8B",
        "--version",
        "2",
        "--uri",
        "s3://weights/llama-3.1-8b",
    )
    assert push.returncode == 0, push.stderr
    c.post("/v1/plans", json={**PLAN, "manifest": "meta-llama/Llama-3.1-8B@2"})
    root = tmp_path / "weights-root"
    (root / "weights").mkdir(parents=True)
    (root / "weights" / "llama-3.1-8b").symlink_to(weights)
    without = node.boot()  # without --weights-root the remote weights cannot be compared: a production plan waits
    assert without.returncode == 3 and node.launches() == []
    assert "is remote and no --weights-root maps it to a local directory: a production plan does not start" in (
        without.stderr
    )
    mapped = node.boot("--weights-root", str(root))
    assert mapped.returncode == 0 and len(node.launches()) == 1, mapped.stderr
    (weights / "quantization.txt").write_text("fp8\n")
    run = node.boot("--weights-root", str(root))
    assert run.returncode == 3 and "quantization.txt: the manifest records no tag, the node has tag fp8" in run.stderr


def test_register_with_a_revoked_token_in_the_file_issues_a_new_one(world):
    url, c, enroll, node, _ = world
    assert node.register(enroll).returncode == 0
    old = node.token_file.read_text().strip()
    c.post("/v1/nodes/gpu-01/token")  # an admin rotated it: the file's token is dead
    again = node.register(enroll)
    assert again.returncode == 0 and "is no longer valid; issuing a new one" in again.stderr
    assert node.token_file.read_text().strip() not in ("", old)
    node.token_file.write_text("pf_" + "x" * 43)  # junk: the same
    assert node.register(enroll).returncode == 0
    boot = node.boot()  # no plan yet, but the token is the node's
    assert boot.returncode == 1 and "has no current plan: nothing runs" in boot.stderr


def test_gpus_used_fails_closed_when_the_selection_cannot_be_mapped():
    """--device-ids or CUDA_VISIBLE_DEVICES that name GPUs by UUID, unknown indices or fewer than the plan uses:
    every GPU of the node is checked (never an empty check that passes)."""
    from service.agent.gpus import ObservedGpu, gpus_used

    gpus = [
        ObservedGpu(
            index=i,
            name="NVIDIA H100 80GB HBM3",
            memory_total_bytes=80 << 30,
            memory_used_bytes=0,
            compute_capability="9.0",
            bus_id=f"00000000:{i:02X}:00.0",
        )
        for i in range(8)
    ]
    one = {"gpus": 1}
    assert [g.index for g in gpus_used(gpus, one, {}, ["vllm", "serve", "m", "--device-ids", "3"])] == [3]
    assert [g.index for g in gpus_used(gpus, one, {"CUDA_VISIBLE_DEVICES": "5"})] == [5]
    for env in (
        {"CUDA_VISIBLE_DEVICES": "GPU-5c3c8a9e"},
        {"CUDA_VISIBLE_DEVICES": "²"},
        {"CUDA_VISIBLE_DEVICES": "9"},
        {"CUDA_VISIBLE_DEVICES": ""},
    ):
        assert len(gpus_used(gpus, one, env)) == 8, env
    assert len(gpus_used(gpus, {"gpus": 4}, {"CUDA_VISIBLE_DEVICES": "1,2"})) == 8
