"""IBM Bamba (`BambaForCausalLM`): Mamba2 layers and Llama attention layers at `attn_layer_indices`, each
followed by a gated MLP (`hybrid.dense_hybrid_layer`).

The attention layers rotate only the leading `partial_rotary_factor` of each head (transformers hard-codes
0.5 for Bamba, over a top-level value too, unless the rope parameters say otherwise), rotate-half, with
Llama's softmax scale. A
layer's norms are `input_layernorm` and `pre_ff_layernorm`, its MLP `feed_forward.*`, its mixer under
`mamba.`; the final norm is `model.final_layernorm`.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.glm import rotary_dim
from jaxinfer.models.granite_moe_hybrid import state_space
from jaxinfer.models.hybrid import abstract_dense_layer, dense_hybrid_layer
from jaxinfer.models.mamba2 import check_activation
from jaxinfer.models.mamba2_mixer import mixer_hf_leaves
from jaxinfer.models.mlp import mlp_hf_leaves
from jaxinfer.models.self_attention import attention_hf_leaves

ARCHITECTURES = ("BambaForCausalLM",)
LAYER = "model.layers.{i}."
HF_RMS_NORM_EPS, HF_MAX_POSITIONS = 1e-5, 262144  # BambaConfig's defaults


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives (each layer reads its attention's or its mixer's, as it has)."""
    D = cfg.hidden_size
    return {
        "attn_norm": HFLeaf(LAYER + "input_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf(LAYER + "pre_ff_layernorm.weight", "same", (D,)),
        **attention_hf_leaves(cfg),
        **mlp_hf_leaves(D, cfg.intermediate_size, LAYER + "feed_forward."),
        **mixer_hf_leaves(cfg.state_space, D, LAYER + "mamba."),
    }


def attention_layers(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """`attn_layer_indices`, checked (none: every layer is Mamba2, as transformers reads it)."""
    indices = tuple(int(i) for i in field(hf, "attn_layer_indices", ()))
    if any(not 0 <= i < num_layers for i in indices):
        raise ConfigError(f"attn_layer_indices {list(indices)} must index the {num_layers} layers (0 to "
                          f"{num_layers - 1})")
    return indices


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Bamba HF config."""
    check_activation(hf, "hidden_act", arch)
    fields = common_fields({k: v for k, v in hf.items() if k not in ("layer_types", "layers_block_type")}, arch)
    layers, eps = fields["num_layers"], float(field(hf, "rms_norm_eps", HF_RMS_NORM_EPS))
    attention = attention_layers(hf, layers)
    bias = bool(field(hf, "attention_bias", False))
    return ModelConfig(
        **{**fields, "rms_norm_eps": eps,
           "max_position_embeddings": int(field(hf, "max_position_embeddings", HF_MAX_POSITIONS))},
        qkv_bias=bias,
        o_bias=bias,
        activation=activation_name(field(hf, "hidden_act", "silu")),
        # transformers sets a top-level partial_rotary_factor to 0.5 for Bamba: only the rope parameters' counts
        rotary_dim=rotary_dim({k: v for k, v in hf.items() if k != "partial_rotary_factor"}, fields["head_dim"]),
        state_space=state_space({**hf, "rms_norm_eps": eps}, tuple(i for i in range(layers) if i not in attention),
                                fields["hidden_size"]),
    )


FAMILY = Family("bamba", ARCHITECTURES, read_config, abstract_dense_layer, hf_leaves, dense_hybrid_layer,
                top_names=("model.embed_tokens.weight", "model.final_layernorm.weight"))
