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
