"""DeepSeek-V4's attention settings, as a config holds them (`ModelConfig.deepseek_v4`; models/deepseek_v4).

Every DeepSeek-V4 layer attends one shared K=V head over a sliding window of `sliding_window` tokens. A compressed
layer also attends entries that each pool a block of tokens into one: a CSA layer ("compressed_sparse_attention")
one entry every `csa_rate` tokens over overlapping windows of 2 * csa_rate, of which each query keeps the
`index_topk` its lightning indexer scores highest; an HCA layer ("heavily_compressed_attention") one entry every
`hca_rate` tokens, all of them attended. The heads' outputs go through a grouped low-rank projection (`o_groups`
groups of heads, each to `o_lora_rank`, then one mix to hidden_size).
"""

from __future__ import annotations

import dataclasses

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
LAYER_KINDS = (SLIDING, CSA, HCA)
HASH_MOE, MOE = "hash_moe", "moe"
MLP_KINDS = (HASH_MOE, MOE)


@dataclasses.dataclass(frozen=True)
class DeepseekV4Fields:
    """The layers' kinds and the attention's sizes (HF names in comments)."""

    layer_kinds: tuple[str, ...]  # layer_types: one of LAYER_KINDS per layer
    hash_layers: tuple[int, ...]  # mlp_layer_types "hash_moe": experts chosen by tid2eid[token], not learned
    sliding_window: int  # sliding_window: raw tokens each query sees, itself included
    csa_rate: int  # compress_rates["compressed_sparse_attention"]: tokens per CSA entry
    hca_rate: int  # compress_rates["heavily_compressed_attention"]: tokens per HCA entry
    q_lora_rank: int  # q_lora_rank: the query's (and the indexer's query's) low-rank input
    o_groups: int  # o_groups: head groups of the grouped output projection
    o_lora_rank: int  # o_lora_rank: each group's projected width
    index_heads: int  # index_n_heads
    index_dim: int  # index_head_dim
    index_topk: int  # index_topk: CSA entries each query attends
