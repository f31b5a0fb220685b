"""Known-good launches written from public vLLM recipes and docs (vllm-project/recipes, docs.vllm.ai serving
guides), as (id, fixture model, (gpu, count), nodes, engine_args)."""

from __future__ import annotations

L8 = "meta-llama__Llama-3.1-8B-Instruct"
L70 = "meta-llama__Meta-Llama-3.1-70B"
Q30 = "Qwen__Qwen3-30B-A3B"
DSV3 = "deepseek-ai__DeepSeek-V3"
H100, H200 = ("h100-sxm-80gb", 8), ("h200-141gb", 8)
OSS = "openai__gpt-oss-120b"
MIX = "mistralai__Mixtral-8x7B-Instruct-v0.1"
MAV = "meta-llama__Llama-4-Maverick-17B-128E-Instruct"
SCOUT = "meta-llama__Llama-4-Scout-17B-16E-Instruct"


RECIPES = [
    # (id, model, (gpu, count), nodes, engine_args)
    (
        "lora-modules",
        L8,
        ("h100-sxm-80gb", 1),
        1,
        {
            "enable_lora": True,
            "lora_modules": ["sql-lora=/loras/sql", "chat-lora=/loras/chat"],
            "max_loras": 4,
            "max_lora_rank": 64,
        },
    ),
    (
        "llama3-tool-calling",
        L8,
        ("h100-sxm-80gb", 1),
        1,
        {"enable_auto_tool_choice": True, "tool_call_parser": "llama3_json"},
    ),
    (
        "qwen3-reasoning-tools",
        Q30,
        ("h100-sxm-80gb", 1),
        1,
        {
            "reasoning_parser": "qwen3",
            "enable_auto_tool_choice": True,
            "tool_call_parser": "hermes",
            "max_model_len": 32768,
        },
    ),
    (
        "qwen3-moe-dp-ep",
        Q30,
        H100,
        1,
        {"data_parallel_size": 8, "enable_expert_parallel": True, "max_model_len": 32768},
    ),
    (
        "deepseek-v3-tp8-ep",
        DSV3,
        H200,
        1,
        {"tensor_parallel_size": 8, "enable_expert_parallel": True, "max_model_len": 32768},
    ),
    (
        "deepseek-v3-mtp",
        DSV3,
        H200,
        1,
        {
            "tensor_parallel_size": 8,
            "speculative_config": {"method": "deepseek_mtp", "num_speculative_tokens": 1},
            "max_model_len": 32768,
        },
    ),
    ("gpt-oss-async", OSS, ("h100-sxm-80gb", 1), 1, {"async_scheduling": True}),
    (
        "gpt-oss-tools",
        OSS,
        ("h100-sxm-80gb", 1),
        1,
        {"tool_call_parser": "openai", "enable_auto_tool_choice": True, "reasoning_parser": "openai_gptoss"},
    ),
    (
        "gpt-oss-tp2-compile",
        OSS,
        ("h100-sxm-80gb", 2),
        1,
        {"tensor_parallel_size": 2, "compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE"}},
    ),
    (
        "nixl-pd",
        L70,
        H100,
        1,
        {
            "tensor_parallel_size": 8,
            "kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
            "max_model_len": 8192,
        },
    ),
    (
        "lmcache-offload",
        L8,
        ("h100-sxm-80gb", 1),
        1,
        {"kv_transfer_config": {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}},
    ),
    ("sleep-mode", L8, ("h100-sxm-80gb", 1), 1, {"enable_sleep_mode": True}),
    ("api-server-count", L8, ("h100-sxm-80gb", 1), 1, {"api_server_count": 4}),
    (
        "dp-hybrid-lb",
        Q30,
        H100,
        1,
        {
            "data_parallel_size": 8,
            "data_parallel_size_local": 8,
            "data_parallel_hybrid_lb": True,
            "enable_expert_parallel": True,
            "max_model_len": 32768,
        },
    ),
    (
        "skip-mm-profiling",
        SCOUT,
        H100,
        1,
        {"tensor_parallel_size": 8, "skip_mm_profiling": True, "max_model_len": 65536},
    ),
    (
        "mm-encoder-dp",
        SCOUT,
        H100,
        1,
        {
            "tensor_parallel_size": 8,
            "mm_encoder_tp_mode": "data",
            "limit_mm_per_prompt": {"image": 2, "video": 0},
            "max_model_len": 65536,
        },
    ),
    ("maverick-tp8", MAV, H200, 1, {"tensor_parallel_size": 8, "max_model_len": 65536}),
    (
        "maverick-tp8-pp2-2nodes",
        MAV,
        H100,
        2,
        {
            "tensor_parallel_size": 8,
            "pipeline_parallel_size": 2,
            "distributed_executor_backend": "ray",
            "max_model_len": 8192,
            "gpu_memory_utilization": 0.9,
        },
    ),
    (
        "disable-custom-all-reduce",
        L70,
        H100,
        1,
        {"tensor_parallel_size": 8, "disable_custom_all_reduce": True, "max_model_len": 8192},
    ),
    (
        "tls",
        L8,
        ("h100-sxm-80gb", 1),
        1,
        {"ssl_keyfile": "/etc/vllm/tls.key", "ssl_certfile": "/etc/vllm/tls.crt", "host": "0.0.0.0", "port": 8443},
    ),
    (
        "eagle3",
        L8,
        ("h100-sxm-80gb", 1),
        1,
        {
            "speculative_config": {
                "method": "eagle3",
                "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                "num_speculative_tokens": 3,
            }
        },
    ),
    (
        "ngram-spec",
        L8,
        ("h100-sxm-80gb", 1),
        1,
        {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}},
    ),
    ("fp8-kv", L70, H100, 1, {"tensor_parallel_size": 4, "kv_cache_dtype": "fp8", "max_model_len": 32768}),
    (
        "prefix-caching-served-name",
        L8,
        ("h100-sxm-80gb", 1),
        1,
        {"enable_prefix_caching": True, "served_model_name": ["llama-3.1-8b", "default"]},
    ),
    (
        "generation-config",
        L8,
        ("h100-sxm-80gb", 1),
        1,
        {"generation_config": "vllm", "override_generation_config": {"temperature": 0.6, "top_p": 0.9}},
    ),
    ("log-requests", L8, ("h100-sxm-80gb", 1), 1, {"enable_log_requests": True, "uvicorn_log_level": "warning"}),
    (
        "chunked-prefill-tuning",
        L8,
        ("h100-sxm-80gb", 1),
        1,
        {"max_num_batched_tokens": 16384, "long_prefill_token_threshold": 4096, "max_num_seqs": 128},
    ),
    ("mixtral-tp2", MIX, ("a100-sxm4-80gb", 2), 1, {"tensor_parallel_size": 2, "max_model_len": 32768}),
    (
        "eplb",
        DSV3,
        H200,
        1,
        {
            "tensor_parallel_size": 8,
            "enable_expert_parallel": True,
            "enable_eplb": True,
            "eplb_config": {"num_redundant_experts": 32},
            "max_model_len": 32768,
        },
    ),
    (
        "mp-backend",
        L70,
        H100,
        1,
        {"tensor_parallel_size": 8, "distributed_executor_backend": "mp", "max_model_len": 8192},
    ),
    ("load-format", L8, ("h100-sxm-80gb", 1), 1, {"load_format": "safetensors", "seed": 0}),
    (
        # the recipe's --api-key goes in the plan's env (VLLM_API_KEY): a secret in the signed argv is refused
        "allowed-origins",
        L8,
        ("h100-sxm-80gb", 1),
        1,
        {"allowed_origins": ["https://app.example.com"]},
    ),
    ("structured-outputs", L8, ("h100-sxm-80gb", 1), 1, {"structured_outputs_config": {"backend": "xgrammar"}}),
    ("max-logprobs", L8, ("h100-sxm-80gb", 1), 1, {"max_logprobs": 20, "max_model_len": "32k"}),
]
