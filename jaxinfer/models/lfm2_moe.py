"""Liquid AI LFM2-MoE (`Lfm2MoeForCausalLM`: LFM2-8B-A1B): LFM2's layers (models/lfm2: gated short convs and
attention by `layer_types`) with routed experts in place of the SwiGLU MLP past the first `num_dense_layers`.

The router scores each of `num_experts` experts by sigmoid(logit) (float32 here, as vLLM keeps it); the top
`num_experts_per_tok` of score + `expert_bias` are chosen (the bias balances load, never weights an output) and
weighted by their unbiased scores, renormalised with `norm_topk_prob` (epsilon 1e-6) and times
`routed_scaling_factor`: DeepSeek-V3's routing with one group (`models.grouped_topk`), GLM-4.5's routed block
(`glm4_moe.moe_block`) without shared experts. The experts are SwiGLU MLPs
of `moe_intermediate_size` stored per expert (`feed_forward.experts.{e}.w1 / w3 / w2`); the dense layers' MLPs
have `intermediate_size` hidden units as stored (no `block_auto_adjust_ff_dim` here). `use_expert_bias` false is
refused by name: the released checkpoint has the bias, and a missing tensor would read as zeros silently.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.config.model import ConfigError, ModelConfig, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.glm4_moe import Glm4MoeLayerWeights, moe_block
from jaxinfer.models.hybrid import ATTENTION_FIELDS, dense_hybrid_layer, hybrid_layer
from jaxinfer.models.lfm2 import LAYER, lfm2_fields, with_short_conv
from jaxinfer.models.lfm2 import abstract_layer as dense_layer
from jaxinfer.models.lfm2 import hf_leaves as dense_hf_leaves
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.moe import ROUTER_AXES, abstract_moe_layer, experts_hf_leaves, is_dense
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.short_conv import ShortConvWeights
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("Lfm2MoeForCausalLM",)
RENORMALISE_EPSILON = 1e-6  # Lfm2MoeTopKRouter's
# Lfm2MoeConfig's defaults for the fields a config may leave out (or null).
HF_DEFAULTS = dict(intermediate_size=7168, moe_intermediate_size=1792, num_dense_layers=2, num_experts=32,
                   num_experts_per_tok=4, use_expert_bias=True, routed_scaling_factor=1.0, norm_topk_prob=True)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ShortConvMoELayer(Glm4MoeLayerWeights):
    """An MoE layer whose mixer is a gated short conv (its attention fields None; the conv's default to None only
    because the parent's fields do)."""

    conv_in: Any = None  # the ShortConvWeights fields (see short_conv)
    conv_weight: jax.Array | None = None
    conv_out: Any = None
    conv_in_bias: jax.Array | None = None
    conv_bias: jax.Array | None = None
    conv_out_bias: jax.Array | None = None

    PROJECTIONS: ClassVar[dict[str, int]] = {
        **{k: v for k, v in Glm4MoeLayerWeights.PROJECTIONS.items() if k not in ATTENTION_FIELDS},
        **ShortConvWeights.PROJECTIONS,
    }
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = ()


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> Any:
    """Layer `layer`'s leaves: LFM2's dense layer in the first `num_dense_layers`, else routed experts (a float32
    router and its bias) behind the layer's attention or short conv."""
    if not cfg.is_moe_layer(layer):
        return dense_layer(cfg, layer)
    D, E = cfg.hidden_size, cfg.num_experts
    routed = abstract_moe_layer(cfg)
    moe = Glm4MoeLayerWeights(
        **{**{f.name: getattr(routed, f.name) for f in dataclasses.fields(routed)},
           "router": ArrayInfo((D, E), ROUTER_AXES, dtype="float32")},
        score_correction=ArrayInfo((E,), (None,), init_value=0.0, dtype="float32"),
    )
    return with_short_conv(moe, cfg, ShortConvMoELayer) if cfg.is_state_layer(layer) else moe


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """LFM2's tensors, and the router, its bias and the per-expert SwiGLUs under `feed_forward.`."""
    mlp = LAYER + "feed_forward."
    return {
        **dense_hf_leaves(cfg),
        "router": HFLeaf(mlp + "gate.weight", "transpose", (cfg.num_experts, cfg.hidden_size)),
        "score_correction": HFLeaf(mlp + "expert_bias", "same", (cfg.num_experts,)),
        **experts_hf_leaves(cfg, mlp + "experts.", ("w1", "w3", "w2")),
    }


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """The mixer (short conv or attention), then the dense SwiGLU or the routed experts."""
    if is_dense(lw):
        return dense_hybrid_layer(cfg, x, cache, lw, layer, positions, rope)
    return hybrid_layer(cfg, x, cache, lw, layer, positions, rope,
                        lambda h, layout: moe_block(h, lw, cfg, layout, RENORMALISE_EPSILON))


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an LFM2-MoE HF config (Lfm2MoeConfig's defaults where a key is absent or null)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    if not field(hf, "use_expert_bias", True):
        raise ConfigError(f"use_expert_bias {hf['use_expert_bias']!r} is not supported for {arch}: true only (the "
                          "released LFM2-8B-A1B routes with its expert_bias)")
    fields = lfm2_fields(hf, arch, int(hf["intermediate_size"]))
    return ModelConfig(
        **fields,
        dense_layers=tuple(range(min(int(hf["num_dense_layers"]), fields["num_layers"]))),
        norm_topk_prob=bool(hf["norm_topk_prob"]),
        routed_scaling_factor=float(hf["routed_scaling_factor"]),
        **moe_fields(hf, "num_experts", int(hf["moe_intermediate_size"]), experts=32, per_token=4),
    )


FAMILY = Family("lfm2_moe", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=("model.embed_tokens.weight", "model.embedding_norm.weight"),
                required=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"))
