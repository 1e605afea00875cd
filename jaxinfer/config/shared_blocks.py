"""Zamba2's shared transformer blocks, as a config holds them (`ModelConfig.shared_blocks`).

Zamba2's hybrid layers each run one of `num_blocks` transformer blocks (attention over the residual stream
concatenated with the input embeddings, then a gated MLP) before their Mamba2 mixer. The blocks are shared:
hybrid layer j runs block j % num_blocks, whose weights transformers stores once, under the first hybrid layer
that runs it. Each use adds its own low-rank adapters (LoRA-like, always on) to the MLP's gate and up projections
and, with `attention_adapters`, to q, k and v; they are stored in the block's adapter lists at index j. Zamba (v1)
shares one block with no adapters (`adapter_rank` 0).
"""

from __future__ import annotations

import dataclasses

from jaxinfer.config.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class SharedBlocks:
    """Which layers run a shared block, how many blocks there are, and the adapters' rank."""

    layers: tuple[int, ...]  # the hybrid layers, in order (HF's hybrid_layer_ids)
    num_blocks: int  # distinct blocks, used in turn (num_mem_blocks)
    adapter_rank: int  # each use's adapters' rank (adapter_rank); 0: no adapters (Zamba v1)
    attention_adapters: bool  # q, k and v have per-use adapters too (use_shared_attention_adapter)

    def __post_init__(self) -> None:
        """Refuse a block count or rank that cannot describe a checkpoint."""
        if self.num_blocks < 1 or self.adapter_rank < 0 or (self.attention_adapters and not self.adapter_rank):
            raise ConfigError(f"num_mem_blocks {self.num_blocks} and adapter_rank {self.adapter_rank} must both be "
                             "positive")

    def use(self, layer: int) -> int:
        """The index of hybrid `layer` among the hybrid layers: its adapters' index in the block's lists."""
        return self.layers.index(layer)

    def stored_at(self, layer: int) -> int:
        """The hybrid layer under whose name `layer`'s block is stored: the first to run it."""
        return self.layers[self.use(layer) % self.num_blocks]
