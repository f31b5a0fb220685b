"""Hostile input: bounded work per request, junk config values are 4xx naming the key, never a 500 or a
hang — on /v1/validate, /v1/manifests and `preflight check`, on both databases."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from service.cli import app as cli
from service.domain import model_facts
from service.domain.errors import DomainError
from service.domain.layer_layout import runs_of
from service.domain.memory import WeightEstimate, biggest_stage, pp_partition, sliding_layers, stage_layers
from service.domain.model_facts import read_model_facts
from tests.support import ROOT, audit_events, model_config, request
from tests.support.gpus import facts_of

LLAMA = "meta-llama__Meta-Llama-3.1-70B"
DSV3 = "deepseek-ai__DeepSeek-V3"
runner = CliRunner()


def llama_with(**changes) -> dict:
    cfg = model_config(LLAMA)
    cfg.update(changes)
    return cfg


def dsv3_with(**changes) -> dict:
    cfg = model_config(DSV3)
    cfg.update(changes)
    return cfg


def dsv3_block(block) -> dict:
    cfg = model_config(DSV3)
    cfg["quantization_config"]["weight_block_size"] = block
    return cfg


# every hostile input that once answered 500 or hung, and the key the 422 must name
JUNK_CONFIGS = [
    (llama_with(num_hidden_layers=10**12), "num_hidden_layers"),
    (llama_with(rope_scaling={"type": "linear", "factor": 1e308}), "rope_scaling.factor"),
    (
        llama_with(rope_scaling={"rope_type": "longrope", "original_max_position_embeddings": "abc"}),
        "original_max_position_embeddings",
    ),
    (dsv3_with(kv_lora_rank="abc"), "kv_lora_rank"),
    (dsv3_with(kv_lora_rank=[1]), "kv_lora_rank"),
    (dsv3_block(["a", "b"]), "weight_block_size"),
    (llama_with(hidden_size=1e300), "hidden_size"),
    (llama_with(num_key_value_heads=128), "num_key_value_heads"),  # more KV heads than attention heads (64)
    (llama_with(max_position_embeddings=-5), "max_position_embeddings"),
    (
        llama_with(rope_scaling={"type": "linear", "factor": 1e4}, max_position_embeddings=2**30),
        "rope_scaling.factor",
    ),  # 2^30 × 1e4 tokens > 2^40
    (llama_with(num_attention_heads=True), "num_attention_heads"),
    (llama_with(vocab_size="128256"), "vocab_size"),
    (llama_with(mlp_only_layers=list(range(20_000))), "mlp_only_layers"),
]


@pytest.mark.parametrize("config,key", JUNK_CONFIGS, ids=[k for _, k in JUNK_CONFIGS])
def test_junk_config_value_is_a_422_naming_the_key_on_validate_and_manifests(client, config, key):
    req = request(LLAMA)
    req["model"]["config"] = config
    r = client.post("/v1/validate", json=req)
    assert r.status_code == 422, r.text
    assert any(key in e["field"] for e in r.json()["errors"]), r.json()
    before = audit_events(client)
    r = client.post("/v1/manifests", json={"name": "m", "version": "1", "uri": "s3://m", "config": config})
    assert r.status_code == 422 and any(key in e["field"] for e in r.json()["errors"]), r.text
    assert audit_events(client) == before


@pytest.mark.parametrize("where", ["config", "env", "report"])
def test_lone_surrogate_is_a_422(client, where):
    """``"\\udc00"`` parses as JSON but cannot be stored or hashed as UTF-8."""
    raw = '"\\udc00"'
    if where == "config":
        body = (
            '{"name": "m", "version": "1", "uri": "s3://m", "config": {"num_attention_heads": 8, '
            f'"num_hidden_layers": 2, "hidden_size": 64, "note": {raw}}}}}'
        )
        r = client.post("/v1/manifests", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422 and "config.note" in r.json()["errors"][0]["field"], r.text
        return
    token = client.post("/v1/nodes", json={"name": "n1", "gpu": "h100-sxm-80gb", "gpu_count": 8}).json()["agent_token"]
    assert (
        client.post(
            "/v1/manifests",
            json={
                "name": "m",
                "version": "1",
                "uri": "s3://m",
                "config": model_config("meta-llama__Meta-Llama-3.1-8B"),
            },
        ).status_code
        == 201
    )
    if where == "env":
        body = f'{{"manifest": "m@1", "nodes": ["n1"], "env": {{"HF_TOKEN": {raw}}}}}'
        r = client.post("/v1/plans", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422 and "env" in r.json()["errors"][0]["field"], r.text
        return
    plan = client.post("/v1/plans", json={"manifest": "m@1", "nodes": ["n1"]}).json()
    body = '{{"plan_id": "{}", "status": "running", "details": {{"x": {}}}}}'.format(plan["id"], raw)
    r = client.post(
        "/v1/nodes/n1/reports",
        content=body,
        headers={"content-type": "application/json", "Authorization": f"Bearer {token}"},
    )
    assert r.status_code == 422 and "details" in r.json()["errors"][0]["field"], r.text


def test_huge_parallel_sizes_are_answered_at_once(client):
    """TP 4096 × PP 1024 × DP 4096 over 3 nodes spun in the nnodes remedy (a list of every divisor up to 1.7e10)."""
    req = request(LLAMA, tensor_parallel_size=4096, pipeline_parallel_size=1024, data_parallel_size=4096, nnodes=3)
    r = client.post("/v1/validate", json=req)
    assert r.status_code in (200, 422), r.text
    if r.status_code == 200:
        assert r.json()["verdict"] == "reject"


# -- hang guard: each hostile request in a subprocess with a deadline (no timing assertions: a hang is a timeout) ----
HOSTILE_FILES = [
    {**request(LLAMA), "model": {"config": llama_with(num_hidden_layers=10**12)}},
    {**request(LLAMA), "model": {"config": llama_with(num_hidden_layers=10_000)}},
    request(LLAMA, tensor_parallel_size=4096, pipeline_parallel_size=1024, data_parallel_size=4096, nnodes=3),
    {
        **request(
            LLAMA,
            count=64,
            nodes=4096,
            tensor_parallel_size=4096,
            pipeline_parallel_size=1024,
            data_parallel_size=4096,
            nnodes=3,
        )
    },
    {
        **request(DSV3, count=64, nodes=4096, pipeline_parallel_size=1024, tensor_parallel_size=64),
        "model": {"config": dsv3_with(num_hidden_layers=10_000, first_k_dense_replace=3)},
    },
    {**request(LLAMA), "model": {"config": llama_with(rope_scaling={"type": "linear", "factor": 1e308})}},
]


def test_hostile_files_finish_in_a_subprocess_with_a_deadline(tmp_path):
    files = []
    for i, req in enumerate(HOSTILE_FILES):
        p = tmp_path / f"hostile-{i}.json"
        p.write_text(json.dumps(req))
        files.append(str(p))
    for f in files:  # one process per file: a hang names the file
        try:
            out = subprocess.run(
                [sys.executable, "-m", "service.cli", "check", "--json", f],
                cwd=ROOT.parent,
                capture_output=True,
                text=True,
                timeout=60,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"preflight check hung on {json.loads(open(f).read())['engine_args']} / {f}")
        assert out.returncode in (0, 1, 2), (f, out.stderr[-2000:])
        line = json.loads(out.stdout.splitlines()[0])
        assert line["verdict"] in ("accept", "warn", "reject", "invalid"), line


# -- closed forms: the per-kind counts of the layer runs equal the per-layer enumeration ---------------------------------
def _layers_by_enumeration(L, first, step, mlp_only):
    return [i >= first and i not in mlp_only and (i % step == 0 if step > 1 else True) for i in range(L)]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    L=st.integers(1, 200),
    pp=st.integers(1, 250),
    first=st.integers(0, 10),
    step=st.integers(1, 4),
    mlp_only=st.sets(st.integers(0, 220), max_size=8),
)
def test_stage_counts_match_the_per_layer_enumeration(L, pp, first, step, mlp_only):
    parts = pp_partition(L, pp)
    starts = [sum(parts[:s]) for s in range(pp)]
    for s in {0, pp - 1, pp // 2, biggest_stage(L, pp)}:
        assert stage_layers(L, pp, s) == (starts[s], parts[s])
    assert parts[biggest_stage(L, pp)] == max(parts) and biggest_stage(L, pp) == parts.index(max(parts))
    kinds = _layers_by_enumeration(L, first, step, mlp_only)
    layout = runs_of([("attention", "moe" if k else "dense") for k in kinds])
    est = WeightEstimate(
        total_params=0,
        total_bytes=0,
        embed_rank=7,
        lm_head_rank=5,
        num_layers=L,
        quant="",
        moe_layers=sum(kinds),
        layout=layout,
        kind_rank=tuple(11 if k.mlp == "moe" else 3 for k in layout.kinds),
    )
    assert est.moe_in(0, L) == sum(kinds) and est.moe_in(first, L // 2) == sum(kinds[first : L // 2])
    per_layer = [11 if k else 3 for k in kinds]
    stage_sums = []
    for s in range(pp):
        b = sum(per_layer[starts[s] : starts[s] + parts[s]]) + (7 if s == 0 else 0) + (5 if s == pp - 1 else 0)
        stage_sums.append(b)
    assert est.max_stage_bytes(pp) == max(stage_sums)


@pytest.mark.parametrize(
    "model_type,extra",
    [
        ("gemma2", {}),
        ("gemma3_text", {"sliding_window_pattern": 6}),
        ("mistral", {}),
        ("gemma3_text", {"sliding_window_pattern": 4}),
    ],
)
def test_sliding_layer_counts_match_the_per_layer_rule(model_type, extra):
    cfg = llama_with(model_type=model_type, sliding_window=4096, num_hidden_layers=46, **extra)
    facts = read_model_facts(cfg)
    pat = extra.get("sliding_window_pattern", 6)
    rule = {"gemma2": lambda i: i % 2 == 0, "mistral": lambda i: True}.get(model_type, lambda i: (i + 1) % pat != 0)
    for start, n in ((0, 46), (3, 10), (40, 6), (45, 1), (12, 0)):
        assert sliding_layers(facts, start, n) == sum(rule(i) for i in range(start, start + n))


def test_bounds_are_generous_for_every_real_config():
    """Every fixture reads (the ranges are documented in model_facts and the README)."""
    for d in (ROOT / "fixtures" / "models").iterdir():
        if not d.is_dir():
            continue
        read_model_facts(json.loads((d / "config.json").read_text()))
    with pytest.raises(DomainError) as e:
        read_model_facts(llama_with(num_hidden_layers=model_facts.MAX_LAYERS + 1))
    assert e.value.field == "model.config.num_hidden_layers"


# -- property: random types and extreme values at every config key the code reads ------------------------------------
CONFIG_KEYS = sorted(
    {
        *model_facts.HEAD_KEYS,
        *model_facts.LAYER_KEYS,
        *model_facts.HIDDEN_KEYS,
        *model_facts.KV_HEAD_KEYS,
        *model_facts.INTERMEDIATE_KEYS,
        *model_facts.EXPERT_KEYS,
        *model_facts.LENGTH_KEYS,
        *model_facts.RAW_INT_KEYS,
        "head_dim",
        "hidden_size_per_head",
        "kv_lora_rank",
        "q_lora_rank",
        "qk_rope_head_dim",
        "qk_nope_head_dim",
        "v_head_dim",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "n_shared_experts",
        "first_k_dense_replace",
        "vocab_size",
        "sliding_window",
        "use_sliding_window",
        "layer_types",
        "mlp_only_layers",
        "moe_layer_freq",
        "rope_scaling",
        "rope_parameters",
        "quantization_config",
        "model_type",
        "architectures",
        "tie_word_embeddings",
        "torch_dtype",
        "dtype",
        "text_config",
        "vision_config",
        "multi_query",
        "new_decoder_architecture",
        "auto_map",
        "compression_config",
    }
)
EXTREME = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53) + 1, 2**53 - 1),
    st.sampled_from([0, -1, 1, 2, 3, 7, 64, 10**4, 10**4 + 1, 2**20, 2**31, 2**40, 2**53 - 1, -(2**53) + 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e300, -1e300, 0.5, 1e-300, 1e308]),
    st.text(max_size=8),
    st.sampled_from(["abc", "", "128", "\u00e9"]),
    st.lists(st.integers(-5, 5), max_size=3),
    st.lists(st.text(max_size=3), max_size=3),
    st.dictionaries(
        st.sampled_from(
            [
                "type",
                "rope_type",
                "factor",
                "original_max_position_embeddings",
                "quant_method",
                "bits",
                "group_size",
                "weight_block_size",
                "config_groups",
                "num_attention_heads",
                "hidden_size",
                "num_hidden_layers",
                "producer",
                "quantization",
                "quant_algo",
            ]
        ),
        st.one_of(
            st.none(),
            st.integers(-2, 2**40),
            st.floats(allow_nan=False, allow_infinity=False),
            st.text(max_size=6),
            st.lists(st.integers(-2, 300), max_size=3),
            st.sampled_from(["linear", "longrope", "dynamic", "fp8", "gptq", "awq", "compressed-tensors", "modelopt"]),
            st.dictionaries(st.text(max_size=3), st.integers(-1, 9), max_size=2),
        ),
        max_size=4,
    ),
)
MUTATIONS = st.lists(st.tuples(st.sampled_from(CONFIG_KEYS), EXTREME), min_size=1, max_size=4)
BASES = [LLAMA, DSV3, "Qwen__Qwen3-30B-A3B"]
PROPERTY = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _mutated(base: str, mutations) -> dict:
    cfg = model_config(base)
    for key, value in mutations:
        cfg[key] = value
    return cfg


@PROPERTY
@given(base=st.sampled_from(BASES), mutations=MUTATIONS)
def test_property_random_config_values_never_500_on_validate_and_manifests(client, base, mutations):
    cfg = _mutated(base, mutations)
    req = request(LLAMA, tensor_parallel_size=2, pipeline_parallel_size=2)
    req["model"]["config"] = cfg
    r = client.post("/v1/validate", json=req)
    assert r.status_code in (200, 422), (mutations, r.text)
    if r.status_code == 422:
        assert r.json()["errors"][0]["field"], r.json()
    r = client.post("/v1/manifests", json={"name": "m", "version": "1", "uri": "s3://m", "config": cfg})
    assert r.status_code in (201, 409, 422), (mutations, r.text)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(base=st.sampled_from(BASES), mutations=MUTATIONS)
def test_property_random_config_values_never_crash_preflight_check(tmp_path_factory, base, mutations):
    req = request(LLAMA, tensor_parallel_size=2)
    req["model"]["config"] = _mutated(base, mutations)
    p = tmp_path_factory.mktemp("prop") / "req.json"
    p.write_text(json.dumps(req))
    r = runner.invoke(cli, ["check", "--json", str(p)])
    assert r.exception is None or isinstance(r.exception, SystemExit), (mutations, r.exception)
    assert r.exit_code in (0, 1, 2), (mutations, r.stdout)
    assert json.loads(r.stdout.splitlines()[0])["verdict"] in ("accept", "warn", "reject", "invalid")


HTTP_GUARD = r"""
import json, sys
from fastapi.testclient import TestClient
from service.api.app import create_app
from service.settings import Settings
settings = Settings(data_dir=sys.argv[1], database_url=sys.argv[2], admin_token="test-admin-token-0123456789")
requests = json.loads(sys.stdin.read())
out = []
with TestClient(create_app(settings)) as c:
    c.headers["Authorization"] = "Bearer test-admin-token-0123456789"
    for method, path, body in requests:
        out.append(c.request(method, path, json=body).status_code)
    out.append(c.get("/healthz").status_code)
print(json.dumps(out))
"""


def test_hostile_http_requests_finish_in_a_subprocess_with_a_deadline(settings, tmp_path):
    """Hostile requests against the service (its database), one process with a deadline: every answer
    is a 4xx or a verdict, and /healthz still answers after them."""
    reqs = [["POST", "/v1/validate", req] for req in HOSTILE_FILES]
    reqs += [
        ["POST", "/v1/manifests", {"name": f"m{i}", "version": "1", "uri": "s3://m", "config": cfg}]
        for i, (cfg, _) in enumerate(JUNK_CONFIGS)
    ]
    try:
        out = subprocess.run(
            [sys.executable, "-c", HTTP_GUARD, str(tmp_path / "var"), settings.resolved_database_url],
            cwd=ROOT.parent,
            input=json.dumps(reqs),
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a hostile request hung the service")
    assert out.returncode == 0, out.stderr[-3000:]
    codes = json.loads(out.stdout.splitlines()[-1])
    assert codes[-1] == 200 and all(c in (200, 422) for c in codes[: len(HOSTILE_FILES)]), codes
    assert all(c == 422 for c in codes[len(HOSTILE_FILES) : -1]), codes


def test_check_reports_too_deeply_nested_json_as_bad_input(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 200_000 + "]" * 200_000)
    r = runner.invoke(cli, ["check", "--json", str(p)])
    assert r.exit_code == 2 and json.loads(r.stdout.splitlines()[0])["verdict"] == "invalid", r.stdout


def test_explicit_null_block_size_is_the_default_not_a_500(client):
    r = client.post("/v1/validate", json=request(LLAMA, block_size=None, tensor_parallel_size=8))
    assert r.status_code == 200 and r.json()["budget"]["block_size"] == 16, r.text


ENGINE_KEYS = [
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "nnodes",
    "node_rank",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "num_gpu_blocks_override",
    "cpu_offload_gb",
    "kv_cache_memory_bytes",
    "speculative_config",
    "gpu_memory_utilization",
    "decode_context_parallel_size",
    "enable_expert_parallel",
    "kv_cache_dtype",
    "dtype",
    "quantization",
]
SPECULATIVE = st.dictionaries(
    st.sampled_from(["method", "num_speculative_tokens", "draft_num_layers", "model"]), EXTREME, max_size=3
)


@PROPERTY
@given(
    base=st.sampled_from(BASES),
    nodes=st.sampled_from([1, 4096]),
    args=st.dictionaries(st.sampled_from(ENGINE_KEYS), st.one_of(EXTREME, SPECULATIVE), max_size=4),
)
def test_property_random_engine_args_never_500(client, base, nodes, args):
    r = client.post("/v1/validate", json=request(base, count=64, nodes=nodes, **args))
    assert r.status_code in (200, 422), (args, r.text)


RLO = "\u202e"


def _bodies():
    l4 = facts_of("l4-1")
    gpu0 = l4["gpus"][0]
    cfg = model_config("meta-llama__Meta-Llama-3.1-8B")
    manifest = {"name": "m", "version": "1", "uri": "s3://m", "config": cfg}
    return [
        (
            "POST",
            "/v1/nodes",
            {"name": "x1", "gpu": "l4-24gb", "gpu_count": 1, "labels": {"rack": f"12{RLO}"}},
            "labels.rack",
        ),
        (
            "POST",
            "/v1/nodes",
            {"name": "x2", "gpu": "l4-24gb", "gpu_count": 1, "labels": {"ra\u200bck": "12"}},
            "labels",
        ),
        ("PATCH", "/v1/nodes/gpu-a", {"labels": {"team": f"a{RLO}b"}}, "labels.team"),
        ("PUT", "/v1/nodes/x3/facts", {**l4, "gpus": [{**gpu0, "name": f"NVIDIA L4{RLO}"}]}, "gpus.0.name"),
        ("PUT", "/v1/nodes/x3/facts", {**l4, "gpus": [{**gpu0, "bus_id": "00000000:00:03.0\u200b"}]}, "gpus.0.bus_id"),
        ("PUT", "/v1/nodes/x3/facts", {**l4, "gpu": f"NVIDIA L4{RLO}"}, "gpu"),
        (
            "PUT",
            "/v1/nodes/x3/facts",
            {**l4, "gpu": {"name": f"Acme{RLO}", "compute_capability": "9.0", "memory_bytes": 80 << 30}},
            "gpu",
        ),
        ("POST", "/v1/manifests", {**manifest, "name": f"llama{RLO}"}, "name"),
        ("POST", "/v1/manifests", {**manifest, "uri": f"s3://m{RLO}"}, "uri"),
        ("POST", "/v1/manifests", {**manifest, "digests": {"config.json": "abc\u2066"}}, "digests"),
        (
            "POST",
            "/v1/manifests",
            {
                **manifest,
                "files": {"config_sha256": "0" * 64, "shards": [{"name": f"model{RLO}.safetensors", "size": 1}]},
            },
            "files.shards.0.name",
        ),
        ("POST", "/v1/tokens", {"role": "auditor", "label": f"ops{RLO}"}, "label"),
        ("POST", "/v1/plans", {"manifest": "llama", "nodes": ["gpu-a"], "env": {"HF_HOME": f"/data{RLO}/x"}}, "env"),
        (
            "POST",
            "/v1/validate",
            {
                "model": {"config": cfg},
                "hardware": {"gpu": {"name": f"Acme{RLO}", "compute_capability": "9.0", "memory_bytes": 80 << 30}},
            },
            "hardware.gpu",
        ),
    ]


@pytest.mark.parametrize("method,path,body,field", _bodies(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_name_with_a_bidi_or_invisible_character_is_a_422_naming_the_field(client, method, path, body, field):
    client.post("/v1/nodes", json={"name": "gpu-a", "gpu": "h100-sxm-80gb", "gpu_count": 8})
    client.post(
        "/v1/manifests",
        json={
            "name": "llama",
            "version": "1",
            "uri": "s3://llama",
            "config": model_config("meta-llama__Meta-Llama-3.1-8B"),
        },
    )
    r = client.request(method, path, json=body)
    assert r.status_code == 422, r.text
    got = r.json()["errors"][0]["field"].replace("[", ".").replace("]", "")
    assert got.startswith(field), r.text
    assert "U+202E" in r.text or "U+200B" in r.text or "U+2066" in r.text


def test_engine_arguments_refuse_c1_controls_too(client):
    client.post(
        "/v1/manifests",
        json={
            "name": "llama",
            "version": "1",
            "uri": "s3://llama",
            "config": model_config("meta-llama__Meta-Llama-3.1-8B"),
        },
    )
    client.post("/v1/nodes", json={"name": "gpu-a", "gpu": "h100-sxm-80gb", "gpu_count": 8})
    r = client.post(
        "/v1/plans",
        json={"manifest": "llama", "nodes": ["gpu-a"], "engine_args": {"served_model_name": "llama\u009b31m"}},
    )
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "engine_args.served_model_name", r.text
    assert "U+009B" in r.text
