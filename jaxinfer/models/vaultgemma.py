"""Google VaultGemma (VaultGemmaForCausalLM): Gemma 2's config and attention in Llama's pre-norm layer.

transformers builds it from Gemma 2's modules less the norms after attention and after the
MLP. Everything else is Gemma 2's, read by `gemma2.read_config`: (1 + w) RMSNorms, embeddings
scaled by sqrt(hidden_size), `query_pre_attn_scalar`, soft-capped scores and logits, sliding
and global layers, the tied head.
"""

from __future__ import annotations

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.gemma2 import VAULTGEMMA, read_config
from jaxinfer.models.llama import abstract_layer, decoder_layer
from jaxinfer.models.mlp import mlp_hf_leaves
from jaxinfer.models.self_attention import attention_hf_leaves


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Llama's leaves, the MLP's norm under Gemma 2's name."""
    D = cfg.hidden_size
    return {
        "attn_norm": HFLeaf("model.layers.{i}.input_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf("model.layers.{i}.pre_feedforward_layernorm.weight", "same", (D,)),
        **attention_hf_leaves(cfg),
        **mlp_hf_leaves(D, cfg.intermediate_size),
    }


FAMILY = Family("vaultgemma", (VAULTGEMMA,), read_config, abstract_layer, hf_leaves, decoder_layer)
