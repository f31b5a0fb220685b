"""The activation peak: what vLLM's profile run leaves as transient headroom (torch peak − allocated after a dummy
forward of ``max_num_batched_tokens`` tokens and the dummy sampler; vllm 0.33.0 vllm/v1/worker/gpu_worker.py:683-757,
vllm/utils/mem_utils.py:230-321), with a multimodal model's encoder pass (``multimodal.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..context import LaunchContext
from ..multimodal import EncoderProfile
from .calibration import CALIBRATION, V0_DEFAULT_MAX_NUM_SEQS, V0_MIN_BATCHED_TOKENS, Accounting


def _topk(text: dict[str, object]) -> int:
    for k in ("num_experts_per_tok", "experts_per_token", "moe_topk", "num_experts_per_token", "top_k"):
        v = text.get(k)
        if isinstance(v, int) and v > 0:
            return v
    return 2


@dataclass(slots=True)  # built per plan: slots, not frozen (a frozen __init__ calls object.__setattr__ per field)
class ProfileRun:
    """The dummy forward of vLLM's profile run: its tokens and sequences, and whether chunked prefill is on."""

    tokens: int
    num_seqs: int
    chunked: bool


def profile_run(ctx: LaunchContext, acct: Accounting) -> ProfileRun:
    """The scheduler values as the release profiles them: V1 the effective ones; V0 chunked prefill off by default
    and ``max(max_model_len, 2048)`` tokens without it."""
    a = ctx.args
    if acct.v1_engine:
        return ProfileRun(ctx.max_num_batched_tokens, ctx.max_num_seqs, ctx.enable_chunked_prefill)
    chunked = bool(a.get("enable_chunked_prefill", False))
    num_seqs = int(a.get("max_num_seqs", V0_DEFAULT_MAX_NUM_SEQS))
    user_mnbt = a.get("max_num_batched_tokens")
    tokens = (
        int(user_mnbt)
        if user_mnbt is not None
        else (ctx.max_num_batched_tokens if chunked else max(ctx.max_model_len, V0_MIN_BATCHED_TOKENS))
    )
    return ProfileRun(tokens, num_seqs, chunked)


def activation_peak(ctx: LaunchContext, tokens: int, num_seqs: int, act_bytes: int, acct: Accounting) -> int:
    """Activation peak of the text forward (gpu_model_runner ``profile_run``).

    Forward pass over ``tokens`` tokens: per token the widest live intermediates — QKV, the MLP's gate/up output and
    its activation (dense: 3 × intermediate / TP, 2 × for a two-matrix MLP; MoE: top-k × 3 × expert width / (TP×DP))
    and two hidden states — in the activation dtype; does not shrink with TP for the hidden states. Then the dummy
    sampler over ``min(max_num_seqs, tokens)`` rows of full-vocabulary fp32 logits (V1: ``sampler_fp32_copies_v1``
    live copies; V0: one).
    """
    f = ctx.facts
    tp = ctx.tp
    H = f.hidden_size
    if f.is_moe:
        moe_i = f.moe_intermediate_size or f.intermediate_size or 4 * H
        width = _topk(f.raw_text_config) * 3 * moe_i / max(1, tp if not ctx.args.enable_expert_parallel else 1)
        if f.shared_expert_intermediate_size or f.n_shared_experts:
            width = max(width, 3 * (f.shared_expert_intermediate_size or f.n_shared_experts * moe_i) / tp)
    else:
        width = f.mlp_matrices * (f.intermediate_size or 4 * H) / tp  # gate_up out + act out, or up out + act out
    qkv = (f.num_attention_heads + 2 * f.total_num_kv_heads) * f.head_dim / tp
    per_token = (2 * H + max(width, qkv)) * act_bytes * CALIBRATION["activation_token_factor"]
    rows = min(num_seqs, tokens)
    copies = CALIBRATION["sampler_fp32_copies_v1"] if acct.v1_engine else CALIBRATION["sampler_fp32_copies_v0"]
    sampler = rows * (f.vocab_size or 32000) * 4 * copies
    return int(tokens * per_token + sampler)


def profile_peak(
    ctx: LaunchContext, run: ProfileRun, mm: EncoderProfile | None, act_bytes: int, acct: Accounting
) -> tuple[int, int, list[str]]:
    """``(tokens of the text forward, activation peak, notes)``: the text forward (V0 multimodal: the sequences and
    tokens the encoder profile leaves), and for a multimodal model the larger of the encoder's own peak and the text
    forward with the encoder outputs held in the encoder cache."""
    text_seqs = mm.text_num_seqs if mm and mm.text_num_seqs else run.num_seqs
    tokens = mm.text_tokens if mm and mm.text_tokens else run.tokens
    activation = activation_peak(ctx, tokens, text_seqs, act_bytes, acct)
    notes: list[str] = []
    if mm and mm.modality:
        activation = max(mm.encoder_peak_bytes, activation + mm.encoder_output_bytes)
        notes.extend(mm.notes)
    elif mm and mm.skipped:
        notes.append(mm.skipped)
    return tokens, activation, notes
