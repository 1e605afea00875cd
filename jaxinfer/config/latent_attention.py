"""The shape of DeepSeek's multi-head latent attention (MLA), as a config holds it (`ModelConfig.latent_attention`)."""

from __future__ import annotations

import dataclasses


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

    @property
    def cached_dims(self) -> int:
        """Values cached per token and layer: the latent, then the rotated key part (R + P)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        """Each head's query and key width in transformers' (unabsorbed) attention: N + P."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim
