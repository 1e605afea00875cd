"""GLM-4-0414 (Glm4ForCausalLM: GLM-4-9B/32B-0414, GLM-Z1): GLM's layer with a norm after each sublayer.

Each sublayer's output is normed before the residual add (`post_self_attn_layernorm`,
`post_mlp_layernorm`) beside GLM's input norms: Gemma 2's sandwich layer with plain RMSNorm
weights. Attention, rotary embeddings, the fused MLP and the config are GLM's (`glm.py`).
"""

from __future__ import annotations

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.gemma2 import SandwichLayerWeights, decoder_layer
from jaxinfer.models.glm import mlp_hf_leaves, read_config
from jaxinfer.models.mlp import mlp_leaves
from jaxinfer.models.self_attention import attention_hf_leaves, attention_leaves
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("Glm4ForCausalLM",)
# Layer field -> the HF norm: the sublayers' input norms and the norms of their outputs.
NORMS = {"attn_norm": "input_layernorm", "post_attn_norm": "post_self_attn_layernorm",
         "mlp_norm": "post_attention_layernorm", "post_mlp_norm": "post_mlp_layernorm"}


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> SandwichLayerWeights:
    """One layer's leaves as ArrayInfos."""
    D = cfg.hidden_size
    norms = {name: ArrayInfo((D,), ("embed",), init_value=1.0) for name in NORMS}
    return SandwichLayerWeights(**norms, **attention_leaves(cfg), **mlp_leaves(D, cfg.intermediate_size))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives in an HF checkpoint."""
    D, layer = cfg.hidden_size, "model.layers.{i}."
    return {
        **{name: HFLeaf(f"{layer}{hf}.weight", "same", (D,)) for name, hf in NORMS.items()},
        **attention_hf_leaves(cfg),
        **mlp_hf_leaves(cfg),
    }


FAMILY = Family("glm4", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
