"""KV cache layouts: contiguous, paged, and the ragged view a step reads."""
