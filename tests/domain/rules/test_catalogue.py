"""docs/rules.md is generated from the rule registry and must stay current; every rule documents itself."""

from __future__ import annotations

import pathlib

import pytest

from service.domain.context import LaunchContext, build_context
from service.domain.errors import DomainError
from service.domain.memory import compute_budget
from service.domain.request import LaunchRequest
from service.domain.rules import RULES, Emit
from service.domain.rules.catalogue import render_markdown
from tests.support import case_files, case_request, load_case, request
from tests.support.rules import FIXTURES

DOCS = pathlib.Path(__file__).resolve().parents[3] / "docs" / "rules.md"


def test_docs_rules_md_is_current():
    assert DOCS.read_text() == render_markdown(), (
        "docs/rules.md is stale: run `python -m service.domain.rules.catalogue > docs/rules.md`"
    )


def test_every_rule_has_source_docstring_and_codes():
    assert RULES
    for info in RULES:
        assert info.source.strip(), info.name
        assert info.what.strip(), info.name
        assert info.codes and all(c and c == c.lower() for c in info.codes), info.name
        assert info.severity in ("error", "warning", "info"), info.name
        assert info.phase in ("config", "budget"), info.name


def test_every_code_appears_in_the_catalogue():
    text = render_markdown()
    for info in RULES:
        for code in info.codes:
            assert f"`{code}`" in text


SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2}
LLAMA = "meta-llama__Llama-3.1-8B-Instruct"
# engine arguments that reach the codes the cases do not
VARIANTS = (
    {"max_num_batched_tokens": 8192, "max_num_seqs": 1, "max_model_len": 4096},
    {"data_parallel_rank": 0, "data_parallel_size": 2, "enable_eplb": True, "revision": "main", "nnodes": 3},
    {"kv_cache_memory_bytes": 1 << 40, "kv_cache_dtype": "float16"},
    {"pipeline_parallel_size": 2, "tensor_parallel_size": 4, "distributed_executor_backend": "uni"},
    {"quantization": "fp8"},
    {"quantization": "awq"},
    {"tensor_parallel_size": 16},
    # what the release loads: a write path, a read path (production), a secret, other weights
    {"compilation_config": {"debug_dump_path": "/tmp/d"}, "chat_template": "/etc/t.jinja", "api_key": ["k"]},
    {"tokenizer": "org/other-tokenizer"},
    # option pairs vLLM refuses in its config classes (numa, microbatching, DCP on GQA, DP modes, sampling, offload)
    {
        "numa_bind_nodes": [0],
        "enable_dbo": True,
        "tensor_parallel_size": 8,
        "decode_context_parallel_size": 2,
        "enable_fault_tolerance": True,
        "data_parallel_multi_port_external_lb": True,
        "enable_batch_sharded_sampling": True,
        "max_logprobs": -1,
        "offload_backend": "prefetch",
        "max_num_active_seqs": 5000,
        "moe_backend": "flashinfer_moe_ep_mega_deep_gemm",
        "grpc_port": 50051,
        "device_ids": "abc",
    },
    # names looked up in a registry or an enum, values checked by the serve and config code
    {
        "reasoning_parser": "x",
        "attention_backend": "x",
        "reasoning_effort_map": {"low": 1},
        "mamba_ssu_algorithm": "simple",
        "return_sampling_mask": True,
    },
)


def _contexts() -> list[LaunchContext]:
    """A launch context for every handed and KV case, plus the fixture grid the rule tests sweep."""
    reqs = [case_request(load_case(p)) for kind in ("handed", "kv") for p in case_files(kind)]
    reqs += [
        request(m, gpu, count=8, environment="production", tensor_parallel_size=tp)
        for m in FIXTURES
        for gpu in ("h100-sxm-80gb", "t4-16gb")
        for tp in (1, 3, 8)
    ]
    reqs += [request(LLAMA, count=8, **args) for args in VARIANTS]
    hc_sp = request("Qwen__Qwen2.5-72B-Instruct", count=8, tensor_parallel_size=8, enable_hc_sp=True)
    reqs.append(hc_sp)
    scout_shm = request("meta-llama__Llama-4-Scout-17B-16E-Instruct", count=8, mm_shm_cache_max_object_size_mb=4)
    scout_shm["vllm_version"] = "0.24.0"
    reqs.append(scout_shm)
    reqs += [
        request("meta-llama__Llama-2-13b-hf", count=1, dtype="bfloat16"),
        request("moonshotai__Kimi-K2.5", count=8, trust_remote_code=True, enable_lora=True),
        request(
            "meta-llama__Llama-4-Scout-17B-16E-Instruct",
            count=8,
            tensor_parallel_size=8,
            disable_chunked_mm_input=True,
            max_num_batched_tokens=64,
            max_num_seqs=64,
            limit_mm_per_prompt={"image": -1},
        ),
    ]
    for version, args in (  # checks older release lines make
        ("0.13.0", {"max_num_partial_prefills": 2, "pooler_config": {"normalize": True}}),
        ("0.13.0", {"async_scheduling": True, "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}),
        ("0.10.2", {"max_num_partial_prefills": 2, "max_long_partial_prefills": 3}),
        ("0.10.2", {"guided_decoding_disable_any_whitespace": True}),
        ("0.24.0", {"dcp_comm_backend": "a2a"}),
        ("0.24.0", {"max_cudagraph_capture_size": 0}),
        ("0.13.0", {"kv_offloading_backend": "native"}),
        ("0.33.0", {"kda_prefill_backend": "fused"}),
    ):
        older = request(LLAMA, count=1, **args)
        older["vllm_version"] = version
        reqs.append(older)
    bad_uri = request(LLAMA, count=1)
    bad_uri["model"]["uri"] = "-x"
    reqs.append(bad_uri)
    short = request(LLAMA, count=1, max_model_len=2048)
    short["workload"] = {"p99_seq_len": 6000}
    reqs.append(short)
    out = []
    for req in reqs:
        try:
            out.append(build_context(LaunchRequest.model_validate(req)))
        except DomainError:
            continue
    return out


def test_every_finding_carries_its_rules_code_and_source():
    """Each rule, run on its own over the test cases, emits only its own codes, stamped with its registered source
    and no worse than its registered severity."""
    emitted: set[str] = set()
    for ctx in _contexts():
        for phase in ("config", "budget"):
            if phase == "budget":
                ctx.budget = compute_budget(ctx)
            for info in (r for r in RULES if r.phase == phase):
                for f in info.func(ctx):
                    assert f.rule in info.codes, (info.name, f.rule)
                    assert f.source == info.source, (info.name, f.source)
                    assert SEVERITY_RANK[f.severity.value] <= SEVERITY_RANK[info.severity], (info.name, f.severity)
                    emitted.add(f.rule)
    # every code but argv_roundtrip (a rendering fault no valid request reaches) is exercised
    assert {c for info in RULES for c in info.codes} - emitted == {"argv_roundtrip"}


def test_one_code_one_rule():
    codes = [c for info in RULES for c in info.codes]
    assert len(codes) == len(set(codes))


def test_a_rule_cannot_emit_another_rules_code():
    emit = Emit(("tp_heads_divisible",), "vllm 0.33.0 vllm/config/model.py:1557-1564")
    assert emit.error("tp_heads_divisible", "m").source == "vllm 0.33.0 vllm/config/model.py:1557-1564"
    with pytest.raises(ValueError):
        emit.warning("tp_kv_heads", "m")
