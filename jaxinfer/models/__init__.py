"""Model families. Every supported architecture is a flag set on the Llama decoder."""

from jaxinfer.models.llama import (
    LayerWeights,
    Weights,
    abstract_weights,
    forward,
    join_projections,
    lm_logits,
    mark_for_gpu_kernel,
    pack_for_cpu,
    quantize_head,
    quantize_weights,
    split_projections,
    unpack_for_cpu,
    weights_to_run,
)

__all__ = ["LayerWeights", "Weights", "abstract_weights", "forward", "join_projections", "lm_logits", "mark_for_gpu_kernel",
           "pack_for_cpu", "quantize_head", "quantize_weights", "split_projections", "unpack_for_cpu",
           "weights_to_run"]
