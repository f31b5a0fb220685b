"""The YAML readers on the deploy-file corpus (tests/fixtures/deploy): exact argv, word places and hardware, and the
dispatch that picks each file's reader."""

from __future__ import annotations

import json
import re

import pytest

from service.sources import compose, helm, kube
from service.sources.found import SourceError
from service.sources.read import read_launches
from service.sources.yaml_load import YamlError
from tests.sources.expected import DEPLOY, EXPECTED, build, read

YAML_KINDS = ("k8s", "lws", "kserve", "helm", "compose")
FILES = sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name.startswith(YAML_KINDS))


def test_the_corpus_is_large_enough_and_every_file_says_what_it_follows():
    assert len(FILES) >= 20
    for name in FILES:
        assert (DEPLOY / name).read_text().startswith("# Follows "), name
        assert re.match(r"(k8s|lws|kserve|helm|compose)-", name)


def test_expected_json_is_current():
    assert json.loads(EXPECTED.read_text()) == json.loads(json.dumps(build()))


@pytest.mark.parametrize("name", sorted(p.name for p in DEPLOY.glob("*.yaml")))
def test_dispatch_picks_one_reader(name):
    """Each YAML kind is claimed by its reader alone; vLLM's own config YAML by none (it is the last kind tried)."""
    path = DEPLOY / name
    text = path.read_text()
    kind = name.split("-")[0]
    want = {
        "compose": (False, True, False),
        "helm": (False, False, True),
        "vllm": (False, False, False),
    }.get(kind, (True, False, False))
    assert (kube.claims(path, text), compose.claims(path, text), helm.claims(path, text)) == want
    found = read_launches(path)
    kinds = {"k8s": {"kubernetes"}, "lws": {"leaderworkerset"}, "vllm": {"vllm-config"}}.get(kind, {kind})
    assert {f.kind for f in found} <= kinds and (found or name == "k8s-pod-not-vllm.yaml")


@pytest.mark.parametrize(
    ("text", "line", "col"),
    [
        ("apiVersion: v1\nkind: Pod\nspec: [vllm, 2\n", 4, 1),
        ("services:\n  vllm:\n    image: a\n    image: b\n", 4, 1),
        ("servingEngineSpec:\n  modelSpec: *nowhere\n", 2, 1),
    ],
)
def test_a_yaml_error_is_a_located_source_error(tmp_path, text, line, col):
    """YamlError is the SourceError ``preflight check`` reports (exit 2) at file:line."""
    path = tmp_path / "deploy.yaml"
    path.write_text(text)
    with pytest.raises(SourceError) as e:
        read_launches(path)
    assert isinstance(e.value, YamlError)
    assert (e.value.at.file, e.value.at.line) == (str(path), line), e.value


def test_a_container_script_that_cannot_be_split_is_a_located_source_error(tmp_path):
    path = tmp_path / "pod.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n    - name: a\n"
        '      command: [sh, -c, "vllm serve \'org/m"]\n'
    )
    with pytest.raises(SourceError, match="never closed") as e:
        read_launches(path)
    assert (e.value.at.line, e.value.at.col) == (6, 37)


def test_a_container_script_reads_the_containers_env_and_places_its_words(tmp_path):
    path = tmp_path / "pod.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n    - name: a\n"
        "      env: [{name: M, value: org/m}, {name: S, valueFrom: {secretKeyRef: {name: s, key: k}}}]\n"
        "      command: [sh, -lc, 'exec vllm serve $M --served-model-name \"$S\"']\n"
    )
    (f,) = read_launches(path)
    assert f.argv == ["vllm", "serve", "org/m", "--served-model-name", "$S"]
    assert [(w.at.line, w.at.col) for w in f.words] == [(7, 32), (7, 37), (7, 43), (7, 46), (7, 66)]
    [(at, message)] = f.problems
    assert (at.line, at.col) == (7, 67) and "$S is set by valueFrom" in message


@pytest.mark.parametrize("name", FILES)
def test_every_located_word_is_where_its_span_says(name):
    """The file's text at each word's line:col is the word (or its opening quote, the ``$`` of the reference it
    was expanded from, or — for a flag the Helm chart writes — the values key it came from)."""
    lines = (DEPLOY / name).read_text().split("\n")
    for launch in read(DEPLOY / name):
        for w in launch.words:
            if w.at is None:
                continue
            assert w.at.file == f"tests/fixtures/deploy/{name}"
            rest = lines[w.at.line - 1][w.at.col - 1 :]
            ok = (
                rest.startswith(w.text)
                or rest[:1] in "'\""
                and rest[1:].startswith(w.text)
                or rest.startswith("$")
                or "=" in rest.split()[0]
                and rest.startswith(w.text.split("=")[0])
                or name.startswith("helm-")
                and re.match(r"[A-Za-z]\w*:|[0-9.]", rest) is not None
                or name.startswith("kserve-huggingface")
                and rest.startswith("--max_length")
            )
            assert ok, (name, w, rest[:40])


def one(name):
    [launch] = read(DEPLOY / name)
    return launch


def spans(launch):
    return [f"{w.at.line}:{w.at.col}" if w.at else None for w in launch.words]


def test_lws_docs_example_leader_runs_the_openai_server_inside_sh_c():
    f = one("lws-llama-405b.yaml")
    assert f.kind == "leaderworkerset" and f.name == "leaderworkerset/vllm/leader/vllm-leader"
    assert f.argv == [
        "python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8080", "--model",
        "meta-llama/Meta-Llama-3.1-405B-Instruct", "--tensor-parallel-size", "8", "--pipeline_parallel_size", "2",
    ]  # fmt: skip
    assert spans(f) == [
        "30:17", "30:25", "30:28", "30:63", "30:70", "30:75", "30:83", "30:123", "30:146", "30:148", "30:173",
    ]  # fmt: skip
    assert (f.gpu_count, f.gpu_product, f.nodes) == (8, "NVIDIA-H100-80GB-HBM3", 2)
    assert f.problems == []


def test_lws_group_size_resolves_and_vllm_serve_follows_ray_start():
    f = one("lws-vllm-serve-ray.yaml")
    assert f.argv[:3] == ["vllm", "serve", "deepseek-ai/DeepSeek-V3"]
    assert spans(f)[:3] == ["24:130", "24:135", "24:141"]
    assert (f.gpu_count, f.gpu_product, f.nodes, f.env) == (8, "NVIDIA-H200", 2, {"VLLM_HOST_IP": "0.0.0.0"})


def test_k8s_docs_deployment_sh_c_args_and_hardware():
    f = one("k8s-deployment-mistral-docs.yaml")
    assert f.argv == [
        "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--trust-remote-code", "--enable-chunked-prefill",
        "--max_num_batched_tokens", "1024",
    ]  # fmt: skip
    assert spans(f)[:3] == ["37:12", "37:17", "37:23"]
    assert (f.gpu_count, f.gpu_product, f.nodes) == (1, "NVIDIA-A100-SXM4-80GB", None)
    assert f.env == {}  # the token comes from a secret


def test_k8s_image_entrypoint_with_args_only():
    f = one("k8s-deployment-args-only-70b.yaml")
    assert f.argv[:4] == ["vllm", "serve", "--model", "meta-llama/Meta-Llama-3.1-70B"]
    assert f.words[0].at is None and f.words[1].at is None and spans(f)[2] == "29:15"
    assert (f.gpu_count, f.gpu_product) == (4, "NVIDIA-H100-80GB-HBM3")  # an affinity term, an integer limit
    assert f.env == {"HF_HOME": "/models", "VLLM_LOGGING_LEVEL": "DEBUG"}


def test_k8s_block_literal_script_places_each_line():
    f = one("k8s-deployment-tp-not-dividing-heads.yaml")
    assert f.argv == ["vllm", "serve", "meta-llama/Meta-Llama-3.1-70B", "--tensor-parallel-size", "3",
                      "--max-model-len", "8192"]  # fmt: skip
    assert spans(f) == ["25:16", "25:21", "25:27", "26:13", "26:36", "27:13", "27:29"]


def test_k8s_env_expansion_and_escape():
    f = one("k8s-statefulset-env-expansion.yaml")
    assert f.argv == [
        "python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "mistralai/Mixtral-8x7B-Instruct-v0.1",
        "--tensor-parallel-size", "2", "--served-model-name", "$(MODEL)",
    ]  # fmt: skip
    assert spans(f)[4] == "33:28" and spans(f)[6] == "33:66"  # at the ``$`` of $(MODEL) / $(TP)
    assert f.problems == []  # $$(MODEL) is the literal $(MODEL), not an unresolved reference
    assert f.env == {"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"}


def test_k8s_value_from_in_the_command_is_a_located_problem():
    f = one("k8s-job-valuefrom-in-args.yaml")
    assert f.argv[2] == "$(MODEL_ID)"
    [(span, message)] = f.problems
    assert (span.line, span.col) == (19, 37) and "valueFrom" in message


def test_a_gpu_pod_that_is_not_vllm_is_no_launch():
    assert read(DEPLOY / "k8s-pod-not-vllm.yaml") == []


def test_kserve_huggingface_runtime_as_the_vllm_serve_it_builds():
    f = one("kserve-huggingface-llama3.yaml")
    assert f.argv == [
        "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "8192",
        "--gpu-memory-utilization", "0.9", "--dtype", "float16",
    ]  # fmt: skip
    assert spans(f) == [None, None, "18:22", "19:11", "19:24", "20:11", "20:36", None, None]
    assert (f.gpu_count, f.gpu_product) == (1, "NVIDIA-L4")


def test_kserve_runtime_merged_with_its_inference_service():
    f = one("kserve-servingruntime-vllm.yaml")
    assert f.argv == [
        "python", "-m", "vllm.entrypoints.openai.api_server", "--port=8080", "--model=/mnt/models",
        "--served-model-name=qwen3-8b", "--distributed-executor-backend=mp", "--max-model-len=16384",
        "--gpu-memory-utilization=0.97",
    ]  # fmt: skip
    assert spans(f)[-2:] == ["52:11", "53:11"]
    assert (f.gpu_count, f.gpu_product, f.env) == (1, "NVIDIA-H100-PCIe", {"HF_HOME": "/tmp/hf_home"})


def test_compose_string_command_and_gpu_reservation():
    f = one("compose-docker-gpu-docs.yaml")
    assert f.argv == [
        "vllm", "serve", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "16384",
        "--gpu-memory-utilization", "0.9",
    ]  # fmt: skip
    assert spans(f)[2:4] == ["15:14", "15:22"]
    assert (f.gpu_count, f.env) == (1, {"VLLM_LOGGING_LEVEL": "INFO"})


def test_compose_shell_entrypoint_folded_command_device_ids():
    f = one("compose-entrypoint-shell.yaml")
    assert f.argv == ["vllm", "serve", "mistralai/Mixtral-8x7B-Instruct-v0.1", "--tensor-parallel-size", "4",
                      "--max-model-len", "32768"]  # fmt: skip
    assert spans(f)[:3] == ["11:9", "11:14", "11:20"]
    assert f.gpu_count == 4 and f.env == {"VLLM_WORKER_MULTIPROC_METHOD": "spawn", "HF_HOME": "/data/hf"}


def test_compose_interpolation_defaults_and_host_variables():
    launches = read(DEPLOY / "compose-interpolation.yaml")
    assert [f.name for f in launches] == ["vllm"]  # open-webui is no launch
    f = launches[0]
    assert f.argv == ["vllm", "serve", "Qwen/Qwen3-8B", "--tensor-parallel-size", "${TP}",
                      "--gpu-memory-utilization", "0.85"]  # fmt: skip
    assert spans(f)[2] == "8:16"
    [(span, message)] = f.problems
    assert (span.line, span.col) == (9, 30) and "docker compose up" in message


def test_compose_runtime_nvidia_visible_devices():
    f = one("compose-unknown-flag.yaml")
    assert f.gpu_count == 2 and f.env == {"HF_HUB_OFFLINE": "1"}
    assert spans(f)[2:] == ["11:9", "12:9", "13:10", "14:9", "15:10"]


def test_helm_basic_config_as_the_chart_writes_it():
    f = one("helm-02-basic-config.yaml")
    assert f.argv == [
        "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port", "8000",
        "--no-enable-chunked-prefill", "--no-enable-prefix-caching", "--max-model-len", "4096", "--dtype", "bfloat16",
        "--gpu-memory-utilization", "0.8",
    ]  # fmt: skip
    assert spans(f) == [None, None, "9:15", None, None, None, None, "21:7", "22:7", "23:7", "23:20", "24:7", "24:14",
                        "25:19", "25:47"]  # fmt: skip
    assert (f.gpu_count, f.gpu_product, f.env) == (1, None, {"HF_HOME": "/data"})


def test_helm_numbers_are_printed_as_go_prints_a_float64():
    f = one("helm-max-model-len-1e6.yaml")
    assert f.argv[f.argv.index("--max-model-len") + 1] == "1e+06"
    assert (f.gpu_count, f.gpu_product) == (8, "NVIDIA-H200")


def test_helm_lmcache_image_and_kv_transfer_config():
    f = one("helm-05-lmcache.yaml")
    assert f.argv[0] == "vllm" and f.words[0].at is None
    assert f.argv[-2:] == ["--kv-transfer-config", '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}']
    assert f.env == {"HF_HOME": "/data", "VLLM_RPC_TIMEOUT": "1000000"}


def test_helm_two_models_two_launches():
    a, b = read(DEPLOY / "helm-04-multiple-models.yaml")
    assert (a.name, a.gpu_product, b.name, b.gpu_product) == ("llama3", "NVIDIA-A10G", "qwen3", None)
    assert b.argv[b.argv.index("--gpu_memory_utilization") + 1] == "0.95"


@pytest.mark.parametrize("name", FILES)
def test_expected_verdicts(name):
    """The wrong files are refused for the reason they were written for."""
    want = {
        "k8s-deployment-tp-not-dividing-heads.yaml": ("reject", "tp_heads_divisible", 26),
        "k8s-deployment-tp-over-gpu-limit.yaml": ("reject", "world_size_exceeds_gpus", 21),
        # vLLM's parser refuses an unknown option before any rule runs: the argv cannot be checked (exit 2)
        "k8s-pod-unknown-flag.yaml": ("reject", "argv_unreadable", 16),
        "compose-unknown-flag.yaml": ("reject", "argv_unreadable", 14),
        "helm-util-097.yaml": ("reject", "util_too_high", 19),
        "lws-vllm-serve-ray.yaml": ("reject", "world_size_exceeds_gpus", 24),
        "k8s-job-valuefrom-in-args.yaml": ("invalid", "source_unreadable", 19),
        "compose-interpolation.yaml": ("invalid", "source_unreadable", 9),
    }.get(name)
    if want is None:
        return
    got = json.loads(EXPECTED.read_text())[name]
    assert (got[0]["verdict"], got[0]["rule"], got[0]["line"]) == want
