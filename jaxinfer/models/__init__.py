"""Model families over shared blocks; `registry` maps HF architectures to them."""

from jaxinfer.models.decoder import Weights, abstract_weights, embed_tokens, forward, forward_with_taps, lm_logits
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.registry import SUPPORTED_ARCHITECTURES, family_of, from_hf_config, load_config
from jaxinfer.models.weight_ops import (
    batch_invariant_weights,
    join_projections,
    leaf_quantizer,
    mark_for_gpu_kernel,
    pack_for_cpu,
    projections,
    quantize_head,
    quantize_weights,
    split_projections,
    unpack_for_cpu,
    weights_to_run,
)

__all__ = ["LayerWeights", "SUPPORTED_ARCHITECTURES", "Weights", "abstract_weights", "batch_invariant_weights",
           "embed_tokens", "family_of",
           "forward", "forward_with_taps", "from_hf_config", "join_projections", "leaf_quantizer", "lm_logits",
           "load_config",
           "mark_for_gpu_kernel", "pack_for_cpu", "projections", "quantize_head", "quantize_weights",
           "split_projections", "unpack_for_cpu", "weights_to_run"]
