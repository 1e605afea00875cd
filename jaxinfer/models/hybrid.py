"""What the hybrid families (state layers beside attention layers) share: a layer's token mixer by its kind,
and the hybrid layer: the mixer, then an MLP (a gated one in Bamba's, dense Granite 4.0-H's, LFM2's and
Qwen3.5's; experts in Granite 4.0-H's, LFM2-MoE's, Qwen3-Next's and Qwen3.5-MoE's).

A dense hybrid layer is Llama's pre-norm layer (`llama.LayerWeights`) whose attention is a Mamba2 mixer
(models/mamba2_mixer) on the state layers: `MambaDenseLayer` keeps the norms and the gated MLP, drops the
attention fields and adds the mixer's (LFM2's `ShortConvLayer` adds a short conv's instead: models/short_conv).
Each sublayer's output may be scaled before its residual add (Granite's `residual_multiplier`; 1.0 for Bamba).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, ClassVar

import jax

from jaxinfer.cache.state_pool import read_state, write_state
from jaxinfer.config.model import ModelConfig
from jaxinfer.models.gated_deltanet import deltanet
from jaxinfer.models.granite import scaled
from jaxinfer.models.kimi_delta import kda
from jaxinfer.models.layers import Weight
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.llama import abstract_layer as llama_abstract_layer
from jaxinfer.models.mamba1_mixer import selective_mixer
from jaxinfer.models.mamba2_mixer import MixerWeights, mixer, mixer_leaves
from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rg_lru import recurrent_block
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, self_attention
from jaxinfer.models.short_conv import short_conv
from jaxinfer.parallel.sharding import Layout

ATTENTION_FIELDS = ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo", "q_norm", "k_norm")  # None on a Mamba2 layer
# A state layer's input projection: Mamba2's, LFM2's short conv's, the Gated DeltaNet's (fused, split or apart: OLMo
# Hybrid's in_q), KDA's
STATE_MIXER_FIELDS = ("in_proj", "conv_in", "in_qkvz", "in_qkv", "in_q", "lru_x")


@dataclasses.dataclass
class MixerFields:
    """The Mamba2 mixer's fields (see mamba2_mixer.MixerWeights) a hybrid layer adds after its parent's (listed
    after the parent, they come after its fields in the pytree); None by default only because the parent's
    fields have defaults."""

    in_proj: Weight | None = None
    conv_weight: jax.Array | None = None
    dt_bias: jax.Array | None = None
    a_log: jax.Array | None = None
    d_skip: jax.Array | None = None
    gate_norm: jax.Array | None = None
    out_proj: Weight | None = None
    conv_bias: jax.Array | None = None
    in_bias: jax.Array | None = None
    out_bias: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MambaDenseLayer(MixerFields, LayerWeights):
    """A dense layer whose mixer is Mamba2 (its attention fields None)."""


    PROJECTIONS: ClassVar[dict[str, int]] = {
        **{k: v for k, v in LayerWeights.PROJECTIONS.items() if k not in ATTENTION_FIELDS},
        **MixerWeights.PROJECTIONS,
    }
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("w_gate", "w_up"),)


def without_attention(layer: Any, cfg: ModelConfig, mamba_type: type) -> Any:
    """`layer`'s leaves as a `mamba_type` (a subclass of its class): attention's None, the mixer's added."""
    kept = {f.name: getattr(layer, f.name) for f in dataclasses.fields(layer) if f.name not in ATTENTION_FIELDS}
    return mamba_type(**kept, **{name: None for name in ATTENTION_FIELDS},
                      **mixer_leaves(cfg.state_space, cfg.hidden_size))


def abstract_dense_layer(cfg: ModelConfig, layer: int = 0) -> LayerWeights:
    """Layer `layer`'s leaves: Llama's, with the mixer's in place of attention on state layers."""
    dense = llama_abstract_layer(cfg, layer)
    return without_attention(dense, cfg, MambaDenseLayer) if cfg.is_state_layer(layer) else dense


def token_mixer(
    cfg: ModelConfig, h: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: RopeTables
) -> tuple[jax.Array, Any]:
    """Layer `layer`'s mixer over the normed h [B, T, D]: Mamba2, Mamba-1, LFM2's short conv, Griffin's recurrent
    block, the Gated DeltaNet or Kimi Delta Attention (its state read and written in the cache) on a state layer,
    else attention (its K/V written).
    The weights tell which (KDA's from the DeltaNet's by `StateSpace.key_decay`): `layer` is 0 in a one-layer view."""
    if all(getattr(lw, name, None) is None for name in STATE_MIXER_FIELDS):
        return self_attention(cfg, h, cache, lw, layer, positions, rope.for_layer(layer))
    state = read_state(cache, layer, cfg, h.shape[0], h.shape[1])
    if getattr(lw, "conv_in", None) is not None:
        out, state = short_conv(lw, h, positions, state)
    elif getattr(lw, "lru_x", None) is not None:  # Griffin's recurrent block (RecurrentGemma)
        out, state = recurrent_block(cfg.state_space, lw, h, positions, state, cfg.activation)
    elif getattr(lw, "x_proj", None) is not None:  # Mamba-1's (Jamba's): its in_proj is no Mamba2 mixer's
        out, state = selective_mixer(cfg.state_space, lw, h, positions, state)
    elif getattr(lw, "in_proj", None) is not None:
        out, state = mixer(cfg.state_space, lw, h, positions, state)
    elif cfg.state_space.key_decay:
        out, state = kda(cfg.state_space, lw, h, positions, state)
    else:
        out, state = deltanet(cfg.state_space, lw, h, positions, state)
    return out, write_state(cache, layer, state)


def hybrid_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: RopeTables,
    mlp: Callable[[jax.Array, Layout], jax.Array],
) -> tuple[jax.Array, Any]:
    """The mixer (a state layer's or attention), then mlp(normed residual, layout), each behind an RMSNorm
    (zero-centred where `norm_weight_offset` says: Qwen3-Next's, Qwen3.5's; scaled before the cast where
    `norm_scale_first` does: LaraMini's), its output normed where the layer has
    `post_attn_norm` / `post_mlp_norm` (LFM3) and scaled by `residual_multiplier` before its residual add."""
    layout, norm = cache.layout, functools.partial(rms_norm, eps=cfg.rms_norm_eps, weight_offset=cfg.norm_weight_offset,
                                                   scale_first=cfg.norm_scale_first)
    out, cache = token_mixer(cfg, norm(x, lw.attn_norm), cache, lw, layer, positions, rope)
    x = layout.constrain(x + sublayer_output(cfg, out, getattr(lw, "post_attn_norm", None)), HIDDEN)
    mixed = mlp(norm(x, lw.mlp_norm), layout)
    return layout.constrain(x + sublayer_output(cfg, mixed, getattr(lw, "post_mlp_norm", None)), HIDDEN), cache


def sublayer_output(cfg: ModelConfig, out: jax.Array, post_norm: jax.Array | None) -> jax.Array:
    """A sublayer's output as the residual stream takes it: RMS-normed where the layer has a post norm (LFM3's
    sandwich norms), scaled by `residual_multiplier`."""
    if post_norm is not None:
        out = rms_norm(out, post_norm, cfg.rms_norm_eps, cfg.norm_weight_offset)
    return scaled(out, cfg.residual_multiplier)


def dense_hybrid_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: LayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """`hybrid_layer` with the gated MLP."""
    mlp = lambda h, _: gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation)  # noqa: E731
    return hybrid_layer(cfg, x, cache, lw, layer, positions, rope, mlp)
