"""Weights per GPU from a checkpoint's own tensors: every tensor classified by how vLLM 0.33 shards it, summed per
decoder layer, so a manifest can store it (a few numbers per layer, never per tensor) and the budget can split it
over TP, DP (experts) and PP stages exactly, where config.json formulas only estimate.

How vLLM 0.33.0 shards each kind of tensor (vllm/model_executor/layers/…):

- ``split`` — ColumnParallelLinear (q/gate/up and friends: ``output_size_per_partition = divide(output_size,
  tp_size)``, linear.py:497) and RowParallelLinear (o/down: ``input_size_per_partition = divide(input_size,
  tp_size)``, linear.py:1708): 1/TP of the bytes per rank. A row-parallel bias is whole on every rank
  (``torch.empty(self.output_size)``, linear.py:1756-1758) and so is ``replicated``.
- ``kv`` — k_proj / v_proj: QKVParallelLinear gives each rank ``total_num_kv_heads / tp`` heads, or one head
  replicated ``tp / total_num_kv_heads`` times when TP exceeds the KV heads (linear.py:1065-1071): 1/min(TP, KV).
- ``replicated`` — norms (1-D), routers (``mlp.gate``: ReplicatedLinear, linear.py:329), MLA's down-projections
  ``q_a_proj`` / ``kv_a_proj_with_mqa`` / ``fused_qkv_a_proj`` (ReplicatedLinear in models/deepseek_v2.py), per-tensor
  scales (one element): whole on every rank.
- ``experts`` — routed experts (``….experts.…``): split over TP × DP — over the EP group of that size with
  expert parallelism (each rank ``global_num_experts / ep_size`` whole experts), otherwise over the TP group
  flattened across DP (fused_moe/config.py:1106-1114 ``flatten_tp_across_dp_and_pcp``); the same bytes per rank.
- the vocabulary (``embed_tokens``, ``lm_head``): padded to a multiple of 64 rows and split over TP
  (vocab_parallel_embedding.py:36, 95, 289-306).
- towers of other modalities (vision, audio) are left out here (the budget has its own profile for them), and
  decoder layers past ``num_hidden_layers`` (DeepSeek/GLM MTP layers: vLLM builds them only as a draft).

A checkpoint saved per rank (``rank_scope`` names) is not described: its files are already one rank's slices.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .tensors import TensorInfo

# vllm 0.33.0 vllm/model_executor/layers/vocab_parallel_embedding.py:36 DEFAULT_VOCAB_PADDING_SIZE
VOCAB_PADDING = 64
MAX_LAYERS = 4096
MAX_BYTES = 1 << 50
SPLIT, KV, REPLICATED, EXPERTS = range(4)
BUCKETS = ("split", "kv", "replicated", "experts")

# a decoder layer: ``model.layers.N.``, ``model.language_model.layers.N.``, ``backbone.layers.N.`` (Nemotron-H),
# ``transformer.h.N.`` (Falcon, GPT-2 style), ``…blocks.N.``
LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d{1,6})\.")
# towers of other modalities and their projectors (Llava, Qwen-VL, Llama 4, Kimi, Gemma 3, …)
TOWER = re.compile(
    r"(?:^|\.)(?:visual|vision_tower|vision_model|vision_encoder|vision_embed_tokens|multi_modal_projector|"
    r"mm_projector|audio_tower|audio_model|audio_encoder|image_newline|vision_projection)(?:\.|$)"
)
EMBED = re.compile(r"(?:^|\.)(?:embed_tokens|wte|word_embeddings|tok_embeddings|embeddings)\.weight$")
LM_HEAD = re.compile(r"(?:^|\.)(?:lm_head|output|embed_out)\.weight$")
# 2-D and more tensors vLLM keeps whole on every rank (ReplicatedLinear / plain nn.Linear modules)
REPLICATED_MODULES = re.compile(
    r"\.(?:gate|router|q_a_proj|kv_a_proj_with_mqa|fused_qkv_a_proj|shared_expert_gate|fc1_latent_proj|"
    r"fc2_latent_proj)\.[^.]+$|\.e_score_correction_bias$"
)
ROW_PARALLEL = re.compile(r"\.(?:o_proj|down_proj|out_proj|dense|w2|c_proj|dense_4h_to_h|wo)\.bias$")
KV_PROJ = re.compile(r"\.(?:k_proj|v_proj)\.[^.]+$")
# 1-D tensors split with the heads: column-parallel biases; Mamba/GDN per-head parameters (mamba_mixer2.py:330-510)
# ``tensors.build_inventory`` names a tensor of a checkpoint saved per rank ``"<scope>/<name>"``
SCOPED = re.compile(r"(?:rank\d+|pp\d+-tp\d+)/")
SPLIT_1D = re.compile(
    r"\.(?:q_proj|gate_proj|up_proj|qkv_proj|query_key_value|w1|w3|c_fc)\.bias$|\.(?:A_log|D|dt_bias)$"
)


@dataclass(frozen=True, slots=True)
class RankWeights:
    """A checkpoint's bytes by how vLLM shards them. ``layers[i]`` = (split, kv, replicated, experts) bytes of decoder
    layer ``i``; ``embedding`` / ``lm_head`` = (rows, bytes) ((0, 0) when tied or absent); ``final``: other text
    tensors (the final norm), on the last PP stage; ``excluded``: towers of other modalities."""

    layers: tuple[tuple[int, int, int, int], ...]
    embedding: tuple[int, int]
    lm_head: tuple[int, int]
    final: int
    excluded: int

    @property
    def total(self) -> int:
        return sum(map(sum, self.layers)) + self.embedding[1] + self.lm_head[1] + self.final + self.excluded

    def as_dict(self) -> dict[str, Any]:
        return {
            "layers": [list(x) for x in self.layers],
            "embedding": list(self.embedding),
            "lm_head": list(self.lm_head),
            "final": self.final,
            "excluded": self.excluded,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RankWeights:
        """From ``as_dict`` (validated by the schema: ``service/domain/request.py`` ``TensorRanks``)."""
        return cls(
            tuple((int(a), int(b), int(c), int(e)) for a, b, c, e in d["layers"]),
            (int(d["embedding"][0]), int(d["embedding"][1])),
            (int(d["lm_head"][0]), int(d["lm_head"][1])),
            int(d["final"]),
            int(d["excluded"]),
        )

    def vocab_rank(self, rows_bytes: tuple[int, int], tp: int) -> int:
        """One TP rank's rows of a vocab-parallel tensor: rows padded to 64, split over TP (vocab_parallel_embedding
        .py:289-306); bytes per row from the tensor."""
        rows, nbytes = rows_bytes
        if not rows:
            return 0
        padded = -(-rows // VOCAB_PADDING) * VOCAB_PADDING
        return -(-padded // tp) * nbytes // rows

    def layer_rank(self, i: int, tp: int, dp: int, kv_heads: int) -> int:
        split, kv, repl, experts = self.layers[i]
        return -(-split // tp) + -(-kv // max(1, min(tp, kv_heads))) + repl + -(-experts // (tp * dp))

    def stage_bytes(self, num_layers: int, tp: int, dp: int, kv_heads: int, pp: int, s: int) -> int:
        """Bytes on one GPU of PP stage ``s``: its decoder layers (vLLM's split, ``stages.stage_layers``), the
        embedding on the first stage, the LM head and final norm on the last."""
        from .memory.stages import stage_layers

        start, n = stage_layers(num_layers, pp, s)
        have = min(len(self.layers), start + n)
        b = sum(self.layer_rank(i, tp, dp, kv_heads) for i in range(start, have))
        if s == 0:
            b += self.vocab_rank(self.embedding, tp)
        if s == pp - 1:
            b += self.vocab_rank(self.lm_head, tp) + self.final
        return b

    def max_stage_bytes(self, num_layers: int, tp: int, dp: int, kv_heads: int, pp: int) -> int:
        """The heaviest PP stage (a pass over the layers: the record is per layer, ≤ MAX_LAYERS)."""
        return max(self.stage_bytes(num_layers, tp, dp, kv_heads, pp, s) for s in range(min(pp, MAX_LAYERS)))


def _bucket(t: TensorInfo) -> int:
    """How vLLM shards one tensor of a decoder layer (the module docstring)."""
    name = t.name
    if ".experts." in name:
        return EXPERTS
    if REPLICATED_MODULES.search(name) or ROW_PARALLEL.search(name):
        return REPLICATED
    if KV_PROJ.search(name):
        return REPLICATED if _elements(t) == 1 else KV
    if len(t.shape) >= 2:
        return SPLIT
    if SPLIT_1D.search(name):
        return SPLIT
    return REPLICATED  # norms, per-tensor scales, other 1-D parameters


def _elements(t: TensorInfo) -> int:
    n = 1
    for d in t.shape:
        n *= d
    return n


def rank_weights(tensors: Mapping[str, TensorInfo]) -> RankWeights | None:
    """The per-layer record of a checkpoint's tensors; None for a checkpoint saved per rank, or with a decoder
    layer numbered MAX_LAYERS or more (a record of that size is not stored)."""
    layers: dict[int, list[int]] = {}
    embedding, lm_head = (0, 0), (0, 0)
    final = excluded = 0
    for t in tensors.values():
        name = t.name
        if SCOPED.match(name):
            return None
        if TOWER.search(name):
            excluded += t.nbytes
            continue
        m = LAYER.search(name)
        if m is not None:
            i = int(m.group(1))
            if i >= MAX_LAYERS:
                return None
            layers.setdefault(i, [0, 0, 0, 0])[_bucket(t)] += t.nbytes
        elif EMBED.search(name) and len(t.shape) == 2 and not embedding[0]:
            embedding = (t.shape[0], t.nbytes)
        elif LM_HEAD.search(name) and len(t.shape) == 2 and not lm_head[0]:
            lm_head = (t.shape[0], t.nbytes)
        else:
            final += t.nbytes
    count = max(layers) + 1 if layers else 0
    rows = tuple((r[0], r[1], r[2], r[3]) for r in (layers.get(i, [0, 0, 0, 0]) for i in range(count)))
    return RankWeights(rows, embedding, lm_head, final, excluded)
