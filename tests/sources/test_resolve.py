"""service/sources/resolve.py: a launch's MODEL word found where vLLM would find it (--models, a directory, the
Hugging Face cache laid out as huggingface_hub writes it, the Hub through a stand-in on 127.0.0.1), and its hardware
from the options, a GPU-feature-discovery label or a stand-in nvidia-smi. No test reaches a real host: every env
names HF_ENDPOINT (the stand-in, or a closed port on 127.0.0.1), and huggingface_hub's own default is never used."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import pytest

from service.domain.request import Hardware, ModelSpec
from service.sources import resolve
from service.sources.found import FoundLaunch, Span, Word
from service.sources.resolve import ResolveError, hub_cache_dir, resolve_hardware, resolve_model
from tests.domain.test_tensor_format import _layout
from tests.support import MODELS, model_config
from tests.support.hub import COMMIT, serve
from tests.support.safetensors_files import write_checkpoint

LLAMA = "meta-llama__Llama-3.1-8B-Instruct"
FP8 = "nvidia__Llama-3.1-70B-Instruct-FP8"
QWEN = "Qwen__Qwen3-8B"
NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing listens, a request fails at once
BF16 = _layout(lambda i, o: {"weight": ("BF16", [o, i])})


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """An environment with an empty cache and a Hub nobody answers at."""
    (tmp_path / "empty-cache").mkdir()
    return {"HF_HUB_CACHE": str(tmp_path / "empty-cache"), "HF_ENDPOINT": NOWHERE, "HF_TOKEN": ""}


def _model_dir(dest: pathlib.Path, name: str) -> pathlib.Path:
    shutil.copytree(MODELS / name, dest)
    return dest


# -- --models and local directories -------------------------------------------------------------------------------


def test_local_directory_absolute_and_relative(tmp_path, env, monkeypatch):
    d = _model_dir(tmp_path / "fp8", FP8)
    got = resolve_model(str(d), env=env)
    assert got["config"] == model_config(FP8) and got["name"] == str(d)
    assert got["hf_quant_config"] == json.loads((MODELS / FP8 / "hf_quant_config.json").read_text())
    assert got["hf_quant_config"]["quantization"]["quant_algo"] == "FP8"
    ModelSpec.model_validate(got)
    monkeypatch.chdir(tmp_path)
    assert resolve_model("fp8", env=env)["config"] == resolve_model("./fp8", env=env)["config"] == model_config(FP8)


def test_local_directory_without_config_is_the_end(tmp_path, env, monkeypatch):
    # vLLM takes a path that exists as the model and looks nowhere else (repo_utils.py:265-266)
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ResolveError, match=r"\(2\) local directory org/name: org/name has no config.json") as e:
        resolve_model("org/name", env=env)
    assert [where for where, _ in e.value.tried] == ["--models", "local directory org/name"]


def test_models_map_wins(tmp_path, env):
    d = _model_dir(tmp_path / "llama", LLAMA)
    got = resolve_model("meta-llama/Llama-3.1-8B-Instruct", models={"meta-llama/Llama-3.1-8B-Instruct": d}, env=env)
    assert got["config"] == model_config(LLAMA) and got["config"]["num_hidden_layers"] == 32
    assert got["name"] == "meta-llama/Llama-3.1-8B-Instruct"
    with pytest.raises(ResolveError, match=r"--models org/x=.*nowhere has no config.json"):
        resolve_model("org/x", models={"org/x": tmp_path / "nowhere"}, env=env)


def test_local_json_nested_too_deep_or_not_an_object(tmp_path, env):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ResolveError, match="JSON nested too deeply"):
        resolve_model(str(d), env=env)
    (d / "config.json").write_text("[1]")
    with pytest.raises(ResolveError, match="is not a JSON object"):
        resolve_model(str(d), env=env)


# -- the Hugging Face cache -------------------------------------------------------------------------------------------


def _cache(root: pathlib.Path, repo: str, snapshots: dict[str, bytes], refs: dict[str, str]) -> pathlib.Path:
    """huggingface_hub's layout (file_download.py: ``models--ORG--NAME/blobs/<sha>``,
    ``snapshots/<commit>/config.json -> ../../blobs/<sha>``, ``refs/<revision>`` holding the commit)."""
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    (repo_dir / "blobs").mkdir(parents=True, exist_ok=True)
    for i, (commit, config) in enumerate(snapshots.items()):
        blob = repo_dir / "blobs" / (f"{i + 1:x}" * 40)
        blob.write_bytes(config)
        (repo_dir / "snapshots" / commit).mkdir(parents=True)
        (repo_dir / "snapshots" / commit / "config.json").symlink_to(f"../../blobs/{blob.name}")
    (repo_dir / "refs").mkdir(exist_ok=True)
    for ref, commit in refs.items():
        (repo_dir / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs" / ref).write_text(commit)
    return root


MAIN, OLDER = "a" * 40, "b" * 40


def _two_revisions(root: pathlib.Path) -> pathlib.Path:
    configs = {MAIN: (MODELS / QWEN / "config.json").read_bytes(), OLDER: (MODELS / LLAMA / "config.json").read_bytes()}
    return _cache(root, "Qwen/Qwen3-8B", configs, {"main": MAIN, "v1": OLDER})


def test_cache_main_a_ref_and_a_commit(tmp_path, env):
    env["HF_HUB_CACHE"] = str(_two_revisions(tmp_path / "hub"))
    assert resolve_model("Qwen/Qwen3-8B", env=env)["config"] == model_config(QWEN)
    assert resolve_model("Qwen/Qwen3-8B", revision="v1", env=env)["config"] == model_config(LLAMA)
    assert resolve_model("Qwen/Qwen3-8B", revision=OLDER, env=env)["config"] == model_config(LLAMA)


def test_cache_location_precedence(tmp_path):
    """huggingface_hub 2.4.0 constants.py:159-183: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    base = {"HF_ENDPOINT": NOWHERE, "HF_TOKEN": "", "HOME": str(tmp_path / "home")}
    _two_revisions(tmp_path / "home" / ".cache" / "huggingface" / "hub")
    assert hub_cache_dir(base) == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    assert resolve_model("Qwen/Qwen3-8B", env=base)["config"] == model_config(QWEN)
    with_home = {**base, "HF_HOME": str(tmp_path / "hf-home")}
    _cache(
        tmp_path / "hf-home" / "hub",
        "Qwen/Qwen3-8B",
        {MAIN: (MODELS / LLAMA / "config.json").read_bytes()},
        {"main": MAIN},
    )
    assert resolve_model("Qwen/Qwen3-8B", env=with_home)["config"] == model_config(LLAMA)
    with_both = {**with_home, "HF_HUB_CACHE": "$HOME/.cache/huggingface/hub"}  # expanded as huggingface_hub does
    assert hub_cache_dir(with_both) == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    assert resolve_model("Qwen/Qwen3-8B", env=with_both)["config"] == model_config(QWEN)


def test_cache_missing_revision_then_offline(tmp_path, env):
    env.update(HF_HUB_CACHE=str(_two_revisions(tmp_path / "hub")), HF_HUB_OFFLINE="1")
    with pytest.raises(ResolveError) as e:
        resolve_model("Qwen/Qwen3-8B", revision="v2", env=env)
    assert "has no snapshot of revision v2 holding config.json" in str(e.value)
    assert e.value.tried[-1] == (f"the Hub {NOWHERE}", "not tried: offline (HF_HUB_OFFLINE=1)")
    with pytest.raises(ResolveError, match="no models--org--absent"):
        resolve_model("org/absent", env=env)


def test_cache_hostile_ref_file(tmp_path, env):
    env["HF_HUB_CACHE"] = str(_two_revisions(tmp_path / "hub"))
    ref = tmp_path / "hub" / "models--Qwen--Qwen3-8B" / "refs" / "main"
    ref.unlink()
    os.mkfifo(ref)  # huggingface_hub reads a ref whole: a FIFO would hold it forever
    with pytest.raises(ResolveError, match="refs/main: not a regular file"):
        resolve_model("Qwen/Qwen3-8B", env=env)


# -- the Hub ------------------------------------------------------------------------------------------------------


@pytest.fixture
def hub(tmp_path, env):
    """The stand-in serving nvidia/Llama-3.1-70B-Instruct-FP8's config.json and hf_quant_config.json with a real
    (tiny) safetensors checkpoint and its index; ``env`` points at it."""
    from service.tensor_readers import read_directory

    extra = {"hf_quant_config.json": (MODELS / FP8 / "hf_quant_config.json").read_text(), "quantization.txt": "fp8\n"}
    d = write_checkpoint(tmp_path / "ckpt", {"model.safetensors": BF16}, model_config(FP8), index=True, extra=extra)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["metadata"]["total_size"] = read_directory(d).total_bytes
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with serve({p.name: p.read_bytes() for p in d.iterdir()}) as (handler, endpoint):
        handler.repo = "nvidia/Llama-3.1-70B-Instruct-FP8"
        env["HF_ENDPOINT"] = endpoint
        yield handler


def test_hub_small_files_only_at_one_commit(hub, env, tmp_path):
    got = resolve_model("nvidia/Llama-3.1-70B-Instruct-FP8", env=env)
    assert got["config"] == model_config(FP8) and got["quantization_txt"] == "fp8\n"
    assert got["hf_quant_config"] == json.loads((MODELS / FP8 / "hf_quant_config.json").read_text())
    assert got["weights_bytes"] == len((tmp_path / "ckpt" / "model.safetensors").read_bytes()) - 8 - int.from_bytes(
        (tmp_path / "ckpt" / "model.safetensors").read_bytes()[:8], "little"
    )
    ModelSpec.model_validate(got)
    assert hub.requested[0] == "/nvidia/Llama-3.1-70B-Instruct-FP8/resolve/main/config.json"
    assert all(f"/resolve/{COMMIT}/" in p for p in hub.requested[1:])
    assert not any(p.endswith(".safetensors") for p in hub.requested)  # never a weight


def test_hub_at_a_revision(hub, env):
    resolve_model("nvidia/Llama-3.1-70B-Instruct-FP8", revision=COMMIT, env=env)
    assert hub.requested[0] == f"/nvidia/Llama-3.1-70B-Instruct-FP8/resolve/{COMMIT}/config.json"
    with pytest.raises(
        ResolveError, match="HTTP 404: no config.json in nvidia/Llama-3.1-70B-Instruct-FP8 at revision v9"
    ):
        resolve_model("nvidia/Llama-3.1-70B-Instruct-FP8", revision="v9", env=env)


def test_hub_refused_when_offline(hub, env):
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        with pytest.raises(ResolveError, match=rf"the Hub http://127.0.0.1:\d+: not tried: offline \({var}=1\)"):
            resolve_model("nvidia/Llama-3.1-70B-Instruct-FP8", env={**env, var: "1"})
    assert hub.requested == []


def test_hub_missing_and_gated_repositories(hub, env):
    hub.refused = {
        "org/missing": (404, "RepoNotFound"),
        "org/gated": (401, "GatedRepo"),
        "org/private": (401, "RepoNotFound"),
    }
    with pytest.raises(ResolveError, match=r"org/missing/config.json: HTTP 404 from .*: no such repository"):
        resolve_model("org/missing", env=env)
    with pytest.raises(
        ResolveError, match=r"org/gated/config.json: HTTP 401 from .*: a gated repository: accept its terms"
    ):
        resolve_model("org/gated", env=env)
    with pytest.raises(ResolveError, match=r"org/private/config.json: HTTP 401 .*or a private one \(set HF_TOKEN\)"):
        resolve_model("org/private", env=env)


def test_hub_oversized_config_refused_unread(hub, env):
    hub.files["config.json"] = b" " * (5 << 20) + b"{}"
    with pytest.raises(ResolveError, match=r"config.json: 5242882 bytes, more than the 4194304 this file may have"):
        resolve_model("nvidia/Llama-3.1-70B-Instruct-FP8", env=env)
    assert hub.ranges == [("config.json", "bytes=0-4194304")]


def test_hub_answer_that_is_not_json(hub, env):
    hub.files["config.json"] = b"<html>sign in</html>"
    with pytest.raises(ResolveError, match="config.json: not JSON"):
        resolve_model("nvidia/Llama-3.1-70B-Instruct-FP8", env=env)


def test_hub_unreachable_names_the_endpoint(env):
    with pytest.raises(ResolveError, match=r"\(4\) the Hub http://127.0.0.1:9: org/name/config.json: ConnectError"):
        resolve_model("org/name", env=env)


def test_hostile_references_reach_nothing(hub, env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # ../../etc may or may not exist from here: refused either way
    for ref, message in [
        ("../../etc", r"neither a directory nor a Hugging Face repository id|has no config.json"),
        ("a" * 5000, "5000 characters long"),
        ("org/na\x00me", "control characters"),
        ("org/name\n--trust-remote-code", "control characters"),
        ("/no/such/model", "neither a directory nor a Hugging Face repository id"),
        ("org/a--b", "neither a directory nor"),
        ("", "empty"),
    ]:
        with pytest.raises(ResolveError, match=message):
            resolve_model(ref, env=env)
    for revision in ("../../../etc", "main\x00", "a" * 300, "refs//x"):
        with pytest.raises(ResolveError, match="is not a branch, tag or commit name"):
            resolve_model("nvidia/Llama-3.1-70B-Instruct-FP8", revision=revision, env=env)
    assert hub.requested == []


# -- the hardware -------------------------------------------------------------------------------------------------


def _found(**hw) -> FoundLaunch:
    return FoundLaunch("kubernetes", Span("deploy.yaml", 12, 9), [Word("vllm"), Word("serve"), Word("m")], **hw)


def _nvidia_smi(tmp_path, monkeypatch, script: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))


H100_LINE = "NVIDIA H100 80GB HBM3, 81559 MiB, 9.0"  # what nvidia-smi prints (the catalogue's memory.total)


def test_what_the_file_says_wins_and_options_fill_in(tmp_path, monkeypatch):
    _nvidia_smi(tmp_path, monkeypatch, f"echo '{H100_LINE}'\n")
    label = _found(gpu_product="NVIDIA-A100-SXM4-40GB", gpu_count=4, nodes=2)
    assert resolve_hardware("l40s-48gb", 2, 1, label) == {"gpu": "a100-sxm4-40gb", "count": 4, "nodes": 2}
    assert resolve_hardware("l40s-48gb", 2, 1, _found()) == {"gpu": "l40s-48gb", "count": 2, "nodes": 1}
    unknown = _found(gpu_product="NVIDIA-Not-A-GPU", gpu_count=4)
    assert resolve_hardware("l40s-48gb", None, None, unknown) == {"gpu": "l40s-48gb", "count": 4, "nodes": 1}


def test_hardware_from_a_gpu_feature_discovery_label(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    got = resolve_hardware(None, None, None, _found(gpu_product="NVIDIA-H100-80GB-HBM3", gpu_count=8, nodes=2))
    assert got == {"gpu": "h100-sxm-80gb", "count": 8, "nodes": 2}
    Hardware.model_validate(got)
    assert resolve_hardware(None, None, None, _found(gpu_product="NVIDIA-A100-SXM4-40GB", gpu_count=1))["gpu"] == (
        "a100-sxm4-40gb"
    )
    for label, message in [
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "is a MIG slice"),
        ("NVIDIA-H100-80GB-HBM3-SHARED", "shared by time-slicing or MPS"),
        ("NVIDIA-Hopper-Next", "not a GPU of the catalogue: give --gpu"),
    ]:
        with pytest.raises(ResolveError, match=message):
            resolve_hardware(None, None, None, _found(gpu_product=label, gpu_count=1))
    with pytest.raises(ResolveError, match="no GPU count: give --gpus N"):
        resolve_hardware(None, None, None, _found(gpu_product="NVIDIA-H100-80GB-HBM3"))


def test_hardware_from_nvidia_smi(tmp_path, monkeypatch):
    _nvidia_smi(tmp_path, monkeypatch, f"for i in 1 2 3 4 5 6 7 8; do echo '{H100_LINE}'; done\n")
    assert resolve_hardware(None, None, None, None) == {"gpu": "h100-sxm-80gb", "count": 8, "nodes": 1}
    assert resolve_hardware(None, 2, None, _found()) == {"gpu": "h100-sxm-80gb", "count": 2, "nodes": 1}
    # a GPU outside the catalogue: what nvidia-smi says of it, not a guess
    _nvidia_smi(tmp_path, monkeypatch, "echo 'NVIDIA RTX 6000 Ada Generation, 49140 MiB, 8.9'\n")
    got = resolve_hardware(None, None, None, None)
    assert got == {
        "gpu": {"name": "NVIDIA RTX 6000 Ada Generation", "compute_capability": "8.9", "memory_bytes": 49140 << 20},
        "count": 1,
        "nodes": 1,
    }
    Hardware.model_validate(got)
    _nvidia_smi(tmp_path, monkeypatch, f"echo '{H100_LINE}'\necho 'NVIDIA H100 PCIe, 81559 MiB, 9.0'\n")
    with pytest.raises(ResolveError, match="GPUs of 2 kinds"):
        resolve_hardware(None, None, None, None)


def test_hardware_nvidia_smi_failing_hanging_or_flooding(tmp_path, monkeypatch):
    _nvidia_smi(
        tmp_path,
        monkeypatch,
        "echo 'NVIDIA-SMI has failed because it couldn'\"'\"'t communicate with the NVIDIA driver.'\nexit 9\n",
    )
    with pytest.raises(ResolveError, match=r"nvidia-smi: exit status 9 \(NVIDIA-SMI has failed"):
        resolve_hardware(None, None, None, None)
    monkeypatch.setattr(resolve, "NVIDIA_SMI_TIMEOUT", 0.5)
    _nvidia_smi(tmp_path, monkeypatch, "exec /bin/sleep 60\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}")
    with pytest.raises(ResolveError, match=r"nvidia-smi: no answer in 0.5 s"):
        resolve_hardware(None, None, None, None)
    _nvidia_smi(tmp_path, monkeypatch, "exec /usr/bin/yes\n")
    with pytest.raises(ResolveError, match=r"nvidia-smi: more than 65536 bytes of output"):
        resolve_hardware(None, None, None, None)


def test_hardware_nothing_found(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ResolveError) as e:
        resolve_hardware(None, None, None, _found(gpu_count=8))
    assert str(e.value).startswith("no GPU: give --gpu NAME")
    assert [where for where, _ in e.value.tried] == ["the file", "--gpu", "nvidia-smi"]
    assert "(3) nvidia-smi: not on PATH" in str(e.value)
