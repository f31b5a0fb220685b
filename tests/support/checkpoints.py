"""Tensor layouts of real public checkpoints, reconstructed from their config.json and the module names their
Transformers classes save (``LlamaForCausalLM``, ``Qwen2/Qwen3ForCausalLM``, ``MixtralForCausalLM``,
``Qwen3MoeForCausalLM``): every tensor's name, dtype and shape, as the checkpoint's safetensors headers list them.
Where the model's index publishes ``metadata.total_size`` the reconstruction is held to it (tests/domain/
test_rank_weights.py); offsets and file boundaries are not reconstructed (they change no byte count)."""

from __future__ import annotations

from service.domain.tensors import DTYPE_BITS, TensorInfo


def _t(out: dict[str, TensorInfo], name: str, shape: tuple[int, ...], dtype: str = "BF16") -> None:
    n = 1
    for d in shape:
        n *= d
    out[name] = TensorInfo(name, dtype, shape, n * DTYPE_BITS[dtype] // 8, "model.safetensors")


def _attention(out: dict[str, TensorInfo], p: str, c: dict) -> None:
    H, nh = c["hidden_size"], c["num_attention_heads"]
    kv = c.get("num_key_value_heads", nh)
    hd = c.get("head_dim") or H // nh
    bias = c.get("model_type") == "qwen2" or c.get("attention_bias") is True
    for proj, rows in (("q_proj", nh * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
        _t(out, f"{p}.self_attn.{proj}.weight", (rows, H))
        if bias:
            _t(out, f"{p}.self_attn.{proj}.bias", (rows,))
    _t(out, f"{p}.self_attn.o_proj.weight", (H, nh * hd))
    if c.get("model_type") in ("qwen3", "qwen3_moe"):  # Qwen3 q/k RMSNorm over head_dim
        _t(out, f"{p}.self_attn.q_norm.weight", (hd,))
        _t(out, f"{p}.self_attn.k_norm.weight", (hd,))


def _mlp(out: dict[str, TensorInfo], p: str, c: dict) -> None:
    H = c["hidden_size"]
    mt = c.get("model_type")
    if mt == "mixtral":
        I, E = c["intermediate_size"], c["num_local_experts"]
        _t(out, f"{p}.block_sparse_moe.gate.weight", (E, H))
        for e in range(E):
            q = f"{p}.block_sparse_moe.experts.{e}"
            _t(out, f"{q}.w1.weight", (I, H))
            _t(out, f"{q}.w2.weight", (H, I))
            _t(out, f"{q}.w3.weight", (I, H))
        return
    if mt == "qwen3_moe":
        I, E = c["moe_intermediate_size"], c["num_experts"]
        _t(out, f"{p}.mlp.gate.weight", (E, H))
        for e in range(E):
            q = f"{p}.mlp.experts.{e}"
            _t(out, f"{q}.gate_proj.weight", (I, H))
            _t(out, f"{q}.up_proj.weight", (I, H))
            _t(out, f"{q}.down_proj.weight", (H, I))
        return
    I = c["intermediate_size"]
    _t(out, f"{p}.mlp.gate_proj.weight", (I, H))
    _t(out, f"{p}.mlp.up_proj.weight", (I, H))
    _t(out, f"{p}.mlp.down_proj.weight", (H, I))


def llama_like(c: dict) -> dict[str, TensorInfo]:
    """The tensors of a bf16 Llama / Qwen2 / Qwen3 / Mixtral / Qwen3-MoE checkpoint of config ``c``."""
    out: dict[str, TensorInfo] = {}
    H, V = c["hidden_size"], c["vocab_size"]
    _t(out, "model.embed_tokens.weight", (V, H))
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        _t(out, f"{p}.input_layernorm.weight", (H,))
        _t(out, f"{p}.post_attention_layernorm.weight", (H,))
        _attention(out, p, c)
        _mlp(out, p, c)
    _t(out, "model.norm.weight", (H,))
    if not c.get("tie_word_embeddings"):
        _t(out, "lm_head.weight", (V, H))
    return out


# -- more families: every tensor name is one the published checkpoint's model.safetensors.index.json weight_map
# lists; shapes from its config.json and the module definitions of vLLM 0.33.0 (the file named in each docstring)
# and Transformers. The total parameter counts their model cards publish are held in tests/domain/
# test_checkpoint_shapes.py (``PUBLISHED_PARAMS``); no index total_size was found for these, so bytes are not.
def _fp8(out: dict[str, TensorInfo], name: str, rows: int, cols: int, block: int = 128) -> None:
    """An FP8 block-quantized linear: ``weight`` F8_E4M3 [out, in] and ``weight_scale_inv`` F32
    [ceil(out / 128), ceil(in / 128)] (vllm 0.33.0 quantization/utils/fp8_utils.py create_fp8_scale_parameter)."""
    _t(out, f"{name}.weight", (rows, cols), "F8_E4M3")
    _t(out, f"{name}.weight_scale_inv", (-(-rows // block), -(-cols // block)), "F32")


def deepseek_v3(c: dict) -> dict[str, TensorInfo]:
    """deepseek-ai/DeepSeek-V3 (FP8 block 128x128, MLA; vllm 0.33.0 models/deepseek_v2.py): q_a/q_b, kv_a_proj_
    with_mqa/kv_b, o_proj; dense MLP in the first ``first_k_dense_replace`` layers, then 256 routed experts, a shared
    expert and the router (BF16, with its F32 ``e_score_correction_bias``); layer 61 is the MTP module (``enorm``,
    ``hnorm``, ``eh_proj``, ``shared_head``, its own ``embed_tokens``), which vLLM builds only as a draft."""
    out: dict[str, TensorInfo] = {}
    H, V = c["hidden_size"], c["vocab_size"]
    nh, ql, kvl = c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
    nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    _t(out, "model.embed_tokens.weight", (V, H))
    for i in range(c["num_hidden_layers"] + c.get("num_nextn_predict_layers", 0)):
        p = f"model.layers.{i}"
        _t(out, f"{p}.input_layernorm.weight", (H,))
        _t(out, f"{p}.post_attention_layernorm.weight", (H,))
        _fp8(out, f"{p}.self_attn.q_a_proj", ql, H)
        _t(out, f"{p}.self_attn.q_a_layernorm.weight", (ql,))
        _fp8(out, f"{p}.self_attn.q_b_proj", nh * (nope + rope), ql)
        _fp8(out, f"{p}.self_attn.kv_a_proj_with_mqa", kvl + rope, H)
        _t(out, f"{p}.self_attn.kv_a_layernorm.weight", (kvl,))
        _fp8(out, f"{p}.self_attn.kv_b_proj", nh * (nope + v), kvl)
        _fp8(out, f"{p}.self_attn.o_proj", H, nh * v)
        if i < c["first_k_dense_replace"]:
            I = c["intermediate_size"]
            _fp8(out, f"{p}.mlp.gate_proj", I, H)
            _fp8(out, f"{p}.mlp.up_proj", I, H)
            _fp8(out, f"{p}.mlp.down_proj", H, I)
        else:
            E, I = c["n_routed_experts"], c["moe_intermediate_size"]
            _t(out, f"{p}.mlp.gate.weight", (E, H))
            _t(out, f"{p}.mlp.gate.e_score_correction_bias", (E,), "F32")
            for e in [*(f"experts.{j}" for j in range(E)), "shared_experts"]:
                _fp8(out, f"{p}.mlp.{e}.gate_proj", I * (c["n_shared_experts"] if e == "shared_experts" else 1), H)
                _fp8(out, f"{p}.mlp.{e}.up_proj", I * (c["n_shared_experts"] if e == "shared_experts" else 1), H)
                _fp8(out, f"{p}.mlp.{e}.down_proj", H, I * (c["n_shared_experts"] if e == "shared_experts" else 1))
        if i >= c["num_hidden_layers"]:  # the MTP module
            for n in ("enorm", "hnorm", "shared_head.norm"):
                _t(out, f"{p}.{n}.weight", (H,))
            _t(out, f"{p}.eh_proj.weight", (H, 2 * H))
            _t(out, f"{p}.embed_tokens.weight", (V, H))
            _t(out, f"{p}.shared_head.head.weight", (V, H))
    _t(out, "model.norm.weight", (H,))
    _t(out, "lm_head.weight", (V, H))
    return out


def qwen3_moe_fp8(c: dict) -> dict[str, TensorInfo]:
    """Qwen/Qwen3-235B-A22B-FP8 (FP8 block 128x128; vllm 0.33.0 models/qwen3_moe.py): every attention and expert
    projection FP8 with ``weight_scale_inv``; the routers, norms, embedding and LM head BF16 (the config's
    ``modules_to_not_convert``)."""
    out: dict[str, TensorInfo] = {}
    H, V = c["hidden_size"], c["vocab_size"]
    nh, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    E, I = c["num_experts"], c["moe_intermediate_size"]
    _t(out, "model.embed_tokens.weight", (V, H))
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        _t(out, f"{p}.input_layernorm.weight", (H,))
        _t(out, f"{p}.post_attention_layernorm.weight", (H,))
        for proj, rows in (("q_proj", nh * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
            _fp8(out, f"{p}.self_attn.{proj}", rows, H)
        _fp8(out, f"{p}.self_attn.o_proj", H, nh * hd)
        _t(out, f"{p}.self_attn.q_norm.weight", (hd,))
        _t(out, f"{p}.self_attn.k_norm.weight", (hd,))
        _t(out, f"{p}.mlp.gate.weight", (E, H))
        for e in range(E):
            _fp8(out, f"{p}.mlp.experts.{e}.gate_proj", I, H)
            _fp8(out, f"{p}.mlp.experts.{e}.up_proj", I, H)
            _fp8(out, f"{p}.mlp.experts.{e}.down_proj", H, I)
    _t(out, "model.norm.weight", (H,))
    _t(out, "lm_head.weight", (V, H))
    return out


def nemotron_h(c: dict) -> dict[str, TensorInfo]:
    """nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 (hybrid; vllm 0.33.0 models/nemotron_h.py, layers/mamba/
    mamba_mixer2.py): ``hybrid_override_pattern`` M = Mamba-2 mixer (``in_proj`` [intermediate + conv_dim + heads,
    H], ``conv1d`` [conv_dim, 1, kernel] with bias, ``A_log`` / ``D`` / ``dt_bias`` per head, a gated norm, ``out_proj``),
    * = attention, E = MoE (relu² experts: ``up_proj`` / ``down_proj`` only, a shared expert, the router with
    ``e_score_correction_bias``); ``backbone.`` prefix, ``norm_f``."""
    out: dict[str, TensorInfo] = {}
    H, V = c["hidden_size"], c["vocab_size"]
    heads, mhd = c["mamba_num_heads"], c["mamba_head_dim"]
    inner = heads * mhd
    conv = inner + 2 * c["n_groups"] * c["ssm_state_size"]
    nh, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    E, I, S = c["n_routed_experts"], c["moe_intermediate_size"], c["moe_shared_expert_intermediate_size"]
    _t(out, "backbone.embeddings.weight", (V, H))
    for i, kind in enumerate(c["hybrid_override_pattern"]):
        p = f"backbone.layers.{i}"
        _t(out, f"{p}.norm.weight", (H,))
        m = f"{p}.mixer"
        if kind == "M":
            _t(out, f"{m}.in_proj.weight", (inner + conv + heads, H))
            _t(out, f"{m}.conv1d.weight", (conv, 1, c["conv_kernel"]))
            _t(out, f"{m}.conv1d.bias", (conv,))
            for n in ("A_log", "D", "dt_bias"):
                _t(out, f"{m}.{n}", (heads,), "F32" if n == "A_log" else "BF16")
            _t(out, f"{m}.norm.weight", (inner,))
            _t(out, f"{m}.out_proj.weight", (H, inner))
        elif kind == "*":
            _t(out, f"{m}.q_proj.weight", (nh * hd, H))
            _t(out, f"{m}.k_proj.weight", (kv * hd, H))
            _t(out, f"{m}.v_proj.weight", (kv * hd, H))
            _t(out, f"{m}.o_proj.weight", (H, nh * hd))
        else:
            _t(out, f"{m}.gate.weight", (E, H), "F32")
            _t(out, f"{m}.gate.e_score_correction_bias", (E,), "F32")
            for e in range(E):
                _t(out, f"{m}.experts.{e}.up_proj.weight", (I, H))
                _t(out, f"{m}.experts.{e}.down_proj.weight", (H, I))
            _t(out, f"{m}.shared_experts.up_proj.weight", (S, H))
            _t(out, f"{m}.shared_experts.down_proj.weight", (H, S))
    _t(out, "backbone.norm_f.weight", (H,))
    _t(out, "lm_head.weight", (V, H))
    return out


def gpt_oss(c: dict) -> dict[str, TensorInfo]:
    """openai/gpt-oss-120b (MXFP4 experts; vllm 0.33.0 models/gpt_oss.py:1382-1385, quantization/mxfp4.py): attention
    q/k/v/o with biases and per-head ``sinks``, the router with bias (BF16, the config's ``modules_to_not_convert``);
    experts fused per layer: ``gate_up_proj_blocks`` U8 [E, 2I, H / 32, 16] with ``_scales`` U8 (E8M0) [E, 2I, H / 32]
    and ``_bias`` BF16 [E, 2I], ``down_proj_blocks`` [E, H, I / 32, 16] likewise."""
    out: dict[str, TensorInfo] = {}
    H, V = c["hidden_size"], c["vocab_size"]
    nh, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    E, I = c["num_local_experts"], c["intermediate_size"]
    _t(out, "model.embed_tokens.weight", (V, H))
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        _t(out, f"{p}.input_layernorm.weight", (H,))
        _t(out, f"{p}.post_attention_layernorm.weight", (H,))
        for proj, rows in (("q_proj", nh * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
            _t(out, f"{p}.self_attn.{proj}.weight", (rows, H))
            _t(out, f"{p}.self_attn.{proj}.bias", (rows,))
        _t(out, f"{p}.self_attn.o_proj.weight", (H, nh * hd))
        _t(out, f"{p}.self_attn.o_proj.bias", (H,))
        _t(out, f"{p}.self_attn.sinks", (nh,))
        _t(out, f"{p}.mlp.router.weight", (E, H))
        _t(out, f"{p}.mlp.router.bias", (E,))
        for proj, rows, cols in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
            _t(out, f"{p}.mlp.experts.{proj}_blocks", (E, rows, cols // 32, 16), "U8")
            _t(out, f"{p}.mlp.experts.{proj}_scales", (E, rows, cols // 32), "U8")
            _t(out, f"{p}.mlp.experts.{proj}_bias", (E, rows))
    _t(out, "model.norm.weight", (H,))
    _t(out, "lm_head.weight", (V, H))
    return out


def llama4(c: dict) -> dict[str, TensorInfo]:
    """meta-llama/Llama-4-{Scout,Maverick} (vllm 0.33.0 models/llama4.py, mllama4.py): the text model under
    ``language_model.``; MoE layers (``moe_layers``, every ``interleave_moe_layer_step``-th) hold a router, experts
    fused per layer (``experts.gate_up_proj`` [E, H, 2I] and ``experts.down_proj`` [E, I, H], stored transposed) and
    a shared expert, the other layers a dense MLP of ``intermediate_size_mlp``; the vision tower
    (``vision_model.``: 34 ViT layers of 1408, its adapter) and ``multi_modal_projector``."""
    out: dict[str, TensorInfo] = {}
    t = c["text_config"]
    H, V = t["hidden_size"], t["vocab_size"]
    nh, kv, hd = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    E, I, D = t["num_local_experts"], t["intermediate_size"], t["intermediate_size_mlp"]
    step = t.get("interleave_moe_layer_step", 1)
    moe = set(t.get("moe_layers") or range(step - 1, t["num_hidden_layers"], step))
    lm = "language_model.model"
    _t(out, f"{lm}.embed_tokens.weight", (V, H))
    for i in range(t["num_hidden_layers"]):
        p = f"{lm}.layers.{i}"
        _t(out, f"{p}.input_layernorm.weight", (H,))
        _t(out, f"{p}.post_attention_layernorm.weight", (H,))
        for proj, rows in (("q_proj", nh * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
            _t(out, f"{p}.self_attn.{proj}.weight", (rows, H))
        _t(out, f"{p}.self_attn.o_proj.weight", (H, nh * hd))
        f = f"{p}.feed_forward"
        if i in moe:
            _t(out, f"{f}.router.weight", (E, H))
            _t(out, f"{f}.experts.gate_up_proj", (E, H, 2 * I))
            _t(out, f"{f}.experts.down_proj", (E, I, H))
            _t(out, f"{f}.shared_expert.gate_proj.weight", (I, H))
            _t(out, f"{f}.shared_expert.up_proj.weight", (I, H))
            _t(out, f"{f}.shared_expert.down_proj.weight", (H, I))
        else:
            _t(out, f"{f}.gate_proj.weight", (D, H))
            _t(out, f"{f}.up_proj.weight", (D, H))
            _t(out, f"{f}.down_proj.weight", (H, D))
    _t(out, f"{lm}.norm.weight", (H,))
    _t(out, "language_model.lm_head.weight", (V, H))
    v = c["vision_config"]
    vh, vi, patch = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    grid = (v["image_size"] // patch) ** 2 + 1
    vm = "vision_model"
    _t(out, f"{vm}.patch_embedding.linear.weight", (vh, v["num_channels"] * patch * patch))
    _t(out, f"{vm}.class_embedding", (vh,))
    _t(out, f"{vm}.positional_embedding_vlm", (grid, vh))
    for n in ("layernorm_pre", "layernorm_post"):
        _t(out, f"{vm}.{n}.weight", (vh,))
        _t(out, f"{vm}.{n}.bias", (vh,))
    for i in range(v["num_hidden_layers"]):
        p = f"{vm}.model.layers.{i}"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            _t(out, f"{p}.self_attn.{proj}.weight", (vh, vh))
            _t(out, f"{p}.self_attn.{proj}.bias", (vh,))
        _t(out, f"{p}.mlp.fc1.weight", (vi, vh))
        _t(out, f"{p}.mlp.fc1.bias", (vi,))
        _t(out, f"{p}.mlp.fc2.weight", (vh, vi))
        _t(out, f"{p}.mlp.fc2.bias", (vh,))
        for n in ("input_layernorm", "post_attention_layernorm"):
            _t(out, f"{p}.{n}.weight", (vh,))
            _t(out, f"{p}.{n}.bias", (vh,))
    shuffled = int(vh / v["pixel_shuffle_ratio"] ** 2)
    _t(out, f"{vm}.vision_adapter.mlp.fc1.weight", (v["projector_input_dim"], shuffled))
    _t(out, f"{vm}.vision_adapter.mlp.fc2.weight", (v["projector_output_dim"], v["projector_input_dim"]))
    _t(out, "multi_modal_projector.linear_1.weight", (H, v["vision_output_dim"]))
    return out


def int4_pack(c: dict, method: str, group: int = 128) -> dict[str, TensorInfo]:
    """A 4-bit AWQ (GEMM) or GPTQ checkpoint of a Qwen2 config (Qwen/Qwen2.5-72B-Instruct-AWQ, -GPTQ-Int4; vllm 0.33.0
    quantization/auto_awq.py:834-870, auto_gptq.py:375-429): every decoder linear a pack — AWQ ``qweight`` I32
    [in, out / 8], GPTQ ``qweight`` I32 [in / 8, out] with ``g_idx`` I32 [in]; ``qzeros`` I32 [in / g, out / 8],
    ``scales`` F16 [in / g, out] — q/k/v biases, norms, embedding and LM head F16."""
    out: dict[str, TensorInfo] = {}
    H, V = c["hidden_size"], c["vocab_size"]
    nh, kv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = H // nh
    I = c["intermediate_size"]

    def pack(name: str, rows: int, cols: int) -> None:  # rows = out, cols = in (the BF16 weight's [out, in])
        if method == "awq":
            _t(out, f"{name}.qweight", (cols, rows // 8), "I32")
        else:
            _t(out, f"{name}.qweight", (cols // 8, rows), "I32")
            _t(out, f"{name}.g_idx", (cols,), "I32")
        _t(out, f"{name}.qzeros", (cols // group, rows // 8), "I32")
        _t(out, f"{name}.scales", (cols // group, rows), "F16")

    _t(out, "model.embed_tokens.weight", (V, H), "F16")
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        _t(out, f"{p}.input_layernorm.weight", (H,), "F16")
        _t(out, f"{p}.post_attention_layernorm.weight", (H,), "F16")
        for proj, rows in (("q_proj", nh * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
            pack(f"{p}.self_attn.{proj}", rows, H)
            _t(out, f"{p}.self_attn.{proj}.bias", (rows,), "F16")
        pack(f"{p}.self_attn.o_proj", H, nh * hd)
        pack(f"{p}.mlp.gate_proj", I, H)
        pack(f"{p}.mlp.up_proj", I, H)
        pack(f"{p}.mlp.down_proj", H, I)
    _t(out, "model.norm.weight", (H,), "F16")
    _t(out, "lm_head.weight", (V, H), "F16")
    return out
