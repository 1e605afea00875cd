"""MiniMax-M3's lightning indexer settings, as a config holds them (`ModelConfig.block_indexer`; models/minimax_m3).

On its `minimax_m3_sparse` layers each query scores every earlier key with `heads` index heads (one per K/V head),
max-pools the scores over blocks of `block` keys and attends, per K/V head, only the keys of that head's
`top_blocks` best blocks, the `local_blocks` blocks ending at its own always among them.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BlockIndexer:
    """The indexer of MiniMax-M3's sparse layers (transformers' `MiniMaxM3VLIndexer`)."""

    heads: int  # index_n_heads: one block choice per K/V head
    dim: int  # index_head_dim: the index query heads' and the one index key's width
    block: int  # index_block_size: keys per scored block, counted from position 0
    top_blocks: int  # index_topk_blocks: blocks each query's K/V head attends
    local_blocks: int  # index_local_blocks: the query's own block and those before it, always attended
    layers: tuple[int, ...]  # the sparse layers (the others attend every earlier key)
