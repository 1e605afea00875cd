"""Gemma 3n's settings beside Gemma 4's, as a config holds them (`ModelConfig.gemma3n`; models/gemma3n).

Gemma 3n runs `altup_inputs` residual streams through every layer (AltUp: the layer runs on stream
`altup_active` and a learned map predicts and corrects the others), adds a low-rank residual (LAuReL, rank
`laurel_rank`) beside attention, and reads its per-layer inputs' token table over the first `per_layer_vocab`
ids only (the rest read row 0, as transformers' `get_per_layer_inputs`). Each layer's activation sparsity is
`ModelConfig.layer_sparsity` (a per-layer tuple, so `layer_calls` hands each layer its own).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Gemma3nFields:
    """AltUp's streams, LAuReL's rank and the per-layer inputs' vocabulary (HF names in comments)."""

    altup_inputs: int  # altup_num_inputs: residual streams, stream 0 the embeddings'
    altup_active: int  # altup_active_idx: the stream each layer runs on
    altup_correct_scale: bool  # altup_correct_scale: the corrected active stream is scaled before the PLE gate
    laurel_rank: int  # laurel_rank
    per_layer_vocab: int  # vocab_size_per_layer_input: rows of the per-layer inputs' token table
