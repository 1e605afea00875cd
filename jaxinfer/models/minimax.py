"""MiniMax-Text-01 (`MiniMaxForCausalLM`): lightning-attention layers (models/lightning_attention) interleaved with
softmax attention layers, each followed by Mixtral's routed experts.

Which layers are which: `layer_types` ("linear_attention" / "full_attention"), by default every other layer from
layer 1 lightning. The attention layers are Mixtral's (rotary over the whole head with `rope_parameters`, a
`sliding_window` if set); the lightning ones keep a state per request where attention keeps pages
(cache/state_pool: prefix caching and speculative decoding refused, as for the other hybrids), their per-head decay
rates derived from the config and handed to each as it runs (`Family.borrowed_leaves`: traced, so the lightning
layers share one trace). Unlike a pre-norm layer, each sublayer's residual is its normed input:
h = norm(x); x' = alpha h + beta mixer(h); h' = norm'(x'); out = alpha' h' + beta' experts(h'), the weights by the
sublayer's kind (`full_attn_*_factor`, `linear_attn_*_factor`, `mlp_*_factor`). The experts route as Mixtral's
(softmax, top k renormalised) under its tensor names; the lightning layers' decay buffers a checkpoint may hold
(`slope_rate`, `query_decay`, `key_decay`, `diagonal_decay`) are derived from the config and not read.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.cache.state_pool import read_state, write_state
from jaxinfer.config.minimax import MiniMaxFields, decay_rates
from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.hybrid import ATTENTION_FIELDS
from jaxinfer.models.lightning_attention import (
    LightningFields,
    lightning,
    lightning_hf_leaves,
    lightning_leaves,
    lightning_state,
)
from jaxinfer.models.mixtral import hf_leaves as mixtral_hf_leaves
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.moe import MoELayerWeights, abstract_moe_layer, moe_block
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, self_attention

ARCHITECTURES = ("MiniMaxForCausalLM",)
KINDS = ("full_attention", "linear_attention")
# MiniMaxConfig's defaults for the fields a config may leave out.
DEFAULTS = dict(rope_theta=1e6, max_position_embeddings=131072, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                block_size=256)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class LightningMoELayer(LightningFields, MoELayerWeights):
    """A lightning layer: Mixtral's norms and experts, the lightning mixer's leaves in attention's place."""

    PROJECTIONS: ClassVar[dict[str, int]] = {"lightning_qkv": 1, "lightning_gate": 1, "lightning_out": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = ()


def abstract_layer(cfg: ModelConfig, layer: int) -> MoELayerWeights:
    """Layer `layer`'s leaves: Mixtral's, the lightning mixer's in place of attention on state layers."""
    base = abstract_moe_layer(cfg)
    if not cfg.is_state_layer(layer):
        return base
    kept = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.name not in ATTENTION_FIELDS}
    return LightningMoELayer(**kept, **dict.fromkeys(ATTENTION_FIELDS),
                             **lightning_leaves(cfg.state_space, cfg.hidden_size))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Mixtral's names, and the lightning mixer's under `self_attn.`."""
    return {**mixtral_hf_leaves(cfg),
            **lightning_hf_leaves(cfg.state_space, cfg.hidden_size, "model.layers.{i}.self_attn.")}


def with_rates(cfg: ModelConfig, layers: list[Any], layer: int) -> Any:
    """Layer `layer`'s weights as it runs: a lightning layer's with its decay rates put in (traced, so its trace is
    every lightning layer's)."""
    lw = layers[layer]
    if getattr(lw, "lightning_qkv", None) is None:
        return lw
    rates = jnp.asarray(decay_rates(cfg.num_heads, layer, cfg.num_layers), jnp.float32)
    return dataclasses.replace(lw, lightning_rates=rates)


def weighted(h: jax.Array, out: jax.Array, factors: tuple[float, float]) -> jax.Array:
    """alpha * h + beta * out, the residual add of a MiniMax sublayer."""
    alpha, beta = factors
    return h * jnp.asarray(alpha, h.dtype) + out * jnp.asarray(beta, out.dtype)


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """Attention or lightning attention on norm(x), weighted with it; the experts on the next norm, likewise."""
    layout, eps, fields = cache.layout, cfg.rms_norm_eps, cfg.minimax
    h = rms_norm(x, lw.attn_norm, eps)
    if getattr(lw, "lightning_qkv", None) is None:
        out, cache = self_attention(cfg, h, cache, lw, layer, positions, rope.for_layer(layer))
        factors = fields.full_factors
    else:
        state = read_state(cache, layer, cfg, h.shape[0], h.shape[1])
        out, state = lightning(cfg.state_space, lw, h, positions, state, cfg.activation)
        cache, factors = write_state(cache, layer, state), fields.linear_factors
    x = layout.constrain(weighted(h, out, factors), HIDDEN)
    h = rms_norm(x, lw.mlp_norm, eps)
    return layout.constrain(weighted(h, moe_block(h, lw, cfg, layout), fields.mlp_factors), HIDDEN), cache


def _factors(hf: Mapping[str, Any], kind: str) -> tuple[float, float]:
    """A sublayer kind's (alpha, beta), each a number (transformers' default 1)."""
    pair = tuple(field(hf, f"{kind}_{part}_factor", 1) for part in ("alpha", "beta"))
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in pair):
        raise ConfigError(f"{kind}_alpha_factor / {kind}_beta_factor {pair!r} must be numbers")
    return float(pair[0]), float(pair[1])


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a MiniMax-Text-01 HF config (MiniMaxConfig's defaults where it says nothing)."""
    hf = {**DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    fields = common_fields(hf, arch)
    layers, heads = fields["num_layers"], fields["num_heads"]
    types = hf.get("layer_types") or ["full_attention" if i % 2 == 0 else "linear_attention" for i in range(layers)]
    if len(types) != layers or not set(types) <= set(KINDS):
        raise ConfigError(f"layer_types {types!r} must list one of {list(KINDS)} for each of the {layers} layers")
    linear = tuple(i for i, t in enumerate(types) if t == "linear_attention")
    block = hf["block_size"]
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ConfigError(f"block_size {block!r} is not supported for {arch}: a positive token count")
    window = int(field(hf, "sliding_window", 0))
    minimax = MiniMaxFields(
        linear_factors=_factors(hf, "linear_attn"), full_factors=_factors(hf, "full_attn"),
        mlp_factors=_factors(hf, "mlp"))
    return ModelConfig(
        **fields,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=tuple(0 if t == "linear_attention" else window for t in types),
        norm_topk_prob=True,
        state_space=lightning_state(linear, heads, fields["head_dim"], block),
        minimax=minimax,
        **moe_fields(hf, "num_local_experts", fields["intermediate_size"]),
    )


FAMILY = Family("minimax", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                borrowed_leaves=with_rates)
