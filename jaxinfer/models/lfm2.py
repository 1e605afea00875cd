"""Liquid AI LFM2 (`Lfm2ForCausalLM`): by `layer_types`, gated short-conv layers (models/short_conv) and attention
layers (GQA with per-head q/k RMSNorms), each followed by a SwiGLU MLP (`hybrid.dense_hybrid_layer`).

A conv layer keeps no K/V but its conv state, the last `conv_L_cache` - 1 inputs of its conv, per request in the
state pool (cache/state_pool) as a Mamba2 layer keeps its own (with no SSM state). Names: `operator_norm` and
`ffn_norm` before the mixer and the MLP, `feed_forward.w1 / w3 / w2` (gate, up, down), attention's `out_proj`,
`q_layernorm` and `k_layernorm`, the conv's `conv.in_proj / conv / out_proj`; the final norm is
`model.embedding_norm`. The MLP's width is transformers' (`block_auto_adjust_ff_dim`: 2/3 of intermediate_size,
times `block_ffn_dim_multiplier`, rounded up to `block_multiple_of`). LiquidAI's LFM2-VL checkpoints
(`Lfm2VlForConditionalGeneration`) run their LFM2 language model alone, text in, text out (models/text_part): their
SigLIP2 NaFlex tower and pixel-unshuffle projector are not run, so images are refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.config.model import ConfigError, ModelConfig, common_fields, field
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.hybrid import ATTENTION_FIELDS, dense_hybrid_layer
from jaxinfer.models.layers import Weight
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.llama import abstract_layer as llama_abstract_layer
from jaxinfer.models.self_attention import attention_hf_leaves
from jaxinfer.models.short_conv import ShortConvWeights, short_conv_hf_leaves, short_conv_leaves

ARCHITECTURES = ("Lfm2ForCausalLM", "Lfm2VlForConditionalGeneration")  # LFM2-VL's language model runs text only
LAYER = "model.layers.{i}."
LAYER_TYPES = ("conv", "full_attention")
HF_THETA = 1e6  # Lfm2Config's default rope theta
# transformers' names for the attention leaves where LFM2's differ from Llama's
ATTENTION_NAMES = {"o_proj": "out_proj", "q_norm": "q_layernorm", "k_norm": "k_layernorm"}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ShortConvLayer(LayerWeights):
    """A dense layer whose mixer is a gated short conv (its attention fields None; the conv's fields default to
    None only because the parent's do)."""

    conv_in: Weight | None = None  # the ShortConvWeights fields (see short_conv)
    conv_weight: jax.Array | None = None
    conv_out: Weight | None = None
    conv_in_bias: jax.Array | None = None
    conv_bias: jax.Array | None = None
    conv_out_bias: jax.Array | None = None

    PROJECTIONS: ClassVar[dict[str, int]] = {
        **{k: v for k, v in LayerWeights.PROJECTIONS.items() if k not in ATTENTION_FIELDS},
        **ShortConvWeights.PROJECTIONS,
    }
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("w_gate", "w_up"),)


def with_short_conv(layer: Any, cfg: ModelConfig, conv_type: type) -> Any:
    """`layer`'s leaves as a `conv_type` (a subclass of its class): attention's None, the short conv's added."""
    kept = {f.name: getattr(layer, f.name) for f in dataclasses.fields(layer) if f.name not in ATTENTION_FIELDS}
    return conv_type(**kept, **{name: None for name in ATTENTION_FIELDS}, **short_conv_leaves(cfg.state_space))


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> LayerWeights:
    """Layer `layer`'s leaves: Llama's (with q/k norms), the short conv's in place of attention on conv layers."""
    dense = llama_abstract_layer(cfg, layer)
    return with_short_conv(dense, cfg, ShortConvLayer) if cfg.is_state_layer(layer) else dense


def attention_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Llama's attention leaves under LFM2's names."""
    leaves = attention_hf_leaves(cfg, LAYER + "self_attn.")
    for llama, lfm2 in ATTENTION_NAMES.items():
        leaves = {k: dataclasses.replace(v, name=v.name.replace(f".{llama}.", f".{lfm2}.")) for k, v in leaves.items()}
    return leaves


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives (each layer reads its attention's or its conv's, as it has)."""
    D, F = cfg.hidden_size, cfg.intermediate_size
    return {
        "attn_norm": HFLeaf(LAYER + "operator_norm.weight", "same", (D,)),
        "mlp_norm": HFLeaf(LAYER + "ffn_norm.weight", "same", (D,)),
        "w_gate": HFLeaf(LAYER + "feed_forward.w1.weight", "transpose", (F, D)),
        "w_up": HFLeaf(LAYER + "feed_forward.w3.weight", "transpose", (F, D)),
        "w_down": HFLeaf(LAYER + "feed_forward.w2.weight", "transpose", (D, F)),
        **attention_leaves(cfg),
        **short_conv_hf_leaves(cfg.state_space, LAYER + "conv."),
    }


def mlp_width(hf: Mapping[str, Any]) -> int:
    """The SwiGLU's hidden units as transformers' Lfm2MLP sizes them."""
    width = int(field(hf, "block_ff_dim", field(hf, "intermediate_size", 12288)))
    if not field(hf, "block_auto_adjust_ff_dim", True):
        return width
    width = int(2 * width / 3)
    multiplier = field(hf, "block_ffn_dim_multiplier", 1.0)
    if multiplier is None:
        return width
    multiple = int(field(hf, "block_multiple_of", 256))
    return multiple * ((int(float(multiplier) * width) + multiple - 1) // multiple)


def conv_layers(hf: Mapping[str, Any], num_layers: int, kinds: tuple[str, ...] = LAYER_TYPES) -> tuple[int, ...]:
    """The layers `layer_types` marks "conv" (else those `full_attn_idxs` leaves out; transformers' default:
    every layer attends); kinds: the layer types the family accepts (LFM3 adds "sliding_attention")."""
    attention = field(hf, "full_attn_idxs", None)
    attention = range(num_layers) if attention is None else attention
    types = field(hf, "layer_types", None) or ["full_attention" if i in attention else "conv"
                                                for i in range(num_layers)]
    if len(types) != num_layers or not set(types) <= set(kinds):
        raise ConfigError(f"layer_types {types!r} must list one of {list(kinds)} for each of the {num_layers} "
                          "layers")
    return tuple(i for i, t in enumerate(types) if t == "conv")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an LFM2 HF config (Lfm2Config's defaults where a key is absent)."""
    return ModelConfig(**lfm2_fields(hf, arch, mlp_width(hf)))


def lfm2_fields(hf: Mapping[str, Any], arch: str, width: int, kinds: tuple[str, ...] = LAYER_TYPES) -> dict[str, Any]:
    """ModelConfig fields of an LFM2, LFM2-MoE or LFM3 config whose dense MLPs have `width` hidden units (kinds: the
    layer types it accepts)."""
    hf = {"rope_theta": HF_THETA, **hf, "intermediate_size": width}
    fields = common_fields({k: v for k, v in hf.items() if k != "layer_types"}, arch)
    layers, kernel = fields["num_layers"], int(field(hf, "conv_L_cache", 3))
    if kernel < 2:
        raise ConfigError(f"conv_L_cache {kernel} is not supported for {arch}; give a conv of at least 2 taps")
    return dict(
        **{**fields, "rms_norm_eps": float(field(hf, "norm_eps", 1e-5)),
           "max_position_embeddings": int(field(hf, "max_position_embeddings", 128000)),
           "tie_word_embeddings": bool(field(hf, "tie_embedding", field(hf, "tie_word_embeddings", True)))},
        qk_norm=True,
        state_space=StateSpace.short_conv(conv_layers(hf, layers, kinds), fields["hidden_size"], kernel,
                                          bool(field(hf, "conv_bias", False))),
    )


FAMILY = Family("lfm2", ARCHITECTURES, read_config, abstract_layer, hf_leaves, dense_hybrid_layer,
                top_names=("model.embed_tokens.weight", "model.embedding_norm.weight"),
                required=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"))
