"""The shape of DeepSeek's multi-head latent attention (MLA), as a config holds it (`ModelConfig.latent_attention`)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LightningIndexer:
    """DeepSeek Sparse Attention's indexer (DeepSeek-V3.2, GLM-5; HF names): each token caches one index key of
    `index_head_dim` values beside its latent row; a query's `index_n_heads` heads score every earlier token's key
    and the MLA attends only the best `index_topk` (see `models.sparse_latent_attention`)."""

    index_topk: int  # tokens each query attends
    index_head_dim: int  # I: the index key's width (its first qk_rope_head_dim dims rotated; its last: rope_last)
    index_n_heads: int  # the scorer's heads
    rope_interleaved: bool  # its rotary pairs: adjacent (GLM-5) or rotate-half (DeepSeek-V3.2)
    rope_last: bool = False  # HY-V4: the last qk_rope_head_dim dims of its keys and queries rotate, not the first
    key_norm_eps: float = 1e-6  # its key LayerNorm's eps (HY-V4's: rms_norm_eps)
    # HY-V4's layers that reuse the last full layer's choice ("shared" indexer_types): they hold no indexer
    shared_layers: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class LatentAttention:
    """MLA's dims (HF names). Each token caches one normed latent of `kv_lora_rank` values and one rotated key
    part of `qk_rope_head_dim` that every head shares; each head's key and value are projections of the latent
    (kv_b_proj), so attention can run in the latent space over the cached rows (see `models.latent_attention`).
    """

    kv_lora_rank: int  # R: the cached latent's width
    qk_nope_head_dim: int  # N: each head's query/key dims without rotary embeddings
    qk_rope_head_dim: int  # P: the rotated dims (the key's are shared by every head)
    v_head_dim: int  # V: each head's value width
    q_lora_rank: int = 0  # the query's low-rank bottleneck (q_a_proj, a norm, q_b_proj); 0: one q_proj
    indexer: LightningIndexer | None = None  # DeepSeek Sparse Attention's (None: dense MLA)
    q_scale: float = 1.0  # LongCat-Flash: the query times sqrt(hidden / q_lora_rank)
    latent_scale: float = 1.0  # and the normed latent times sqrt(hidden / kv_lora_rank)

    @property
    def cached_dims(self) -> int:
        """Values cached per token and layer: the latent, then the rotated key part (R + P), then the indexer's
        key where there is one (R + P + I)."""
        index = self.indexer.index_head_dim if self.indexer else 0
        return self.kv_lora_rank + self.qk_rope_head_dim + index

    @property
    def qk_head_dim(self) -> int:
        """Each head's query and key width in transformers' (unabsorbed) attention: N + P."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim
