"""MiMo-V2-Flash (MiMoV2FlashForCausalLM, Xiaomi's 309B-A15B): hybrid sliding/full attention over GLM-4.5's MoE.

A pre-norm decoder whose layers are sliding (window `sliding_window`, which counts the query: a config's
`sliding_window_size` is the keys before it, so the window is one more) or full (`layer_types`: the first and every
6th full). The two kinds differ in more than the window:
- a sliding layer has twice the kv heads (`cfg.layer_kv_heads`) and a learned sink logit per head (GPT-OSS's, see
  `blocked_attention.softmax_with_sinks`); a full layer has neither;
- each kind rotates with its own rope theta (`cfg.local_rope_theta` for the sliding ones), both over the leading
  `partial_rotary_factor` of the head (int(192 * 0.334) = 64 dims), rotate-half.
q and k heads are `head_dim` (192) wide, v heads `v_head_dim` (128): values are scaled by `attention_value_scale`,
then stored zero-padded to the key width in the paged cache (which keeps K and V alike: 1.5x the value bytes, 1.2x
the cache), and each head's output drops the padding (its zero columns) before o_proj.
The MLP is dense where `mlp_layer_types` says "dense" (the first layer), else GLM-4.5's MoE layer (`glm4_moe`):
DeepSeek-V3's grouped sigmoid routing with a correction bias and `routed_scaling_factor`, no shared experts.
Multi-token-prediction weights (`model.mtp.*`) are not run, and not read. The config (transformers' spelling
and the released checkpoint's) is read in `mimo_v2_flash_config`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.attention import attend
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.glm4_moe import Glm4MoeLayerWeights, moe_block
from jaxinfer.models.glm4_moe import abstract_layer as glm4_moe_layer
from jaxinfer.models.glm4_moe import hf_leaves as glm4_moe_hf_leaves
from jaxinfer.models.layers import linear, linears
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.mimo_v2_flash_config import ARCHITECTURES, read_config
from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import CosSin, RopeTables, apply_rope
from jaxinfer.models.self_attention import HIDDEN, KV_HEADS, Q_HEADS
from jaxinfer.parallel.array_info import ArrayInfo

ATTN = "model.layers.{i}.self_attn."


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DenseLayerWeights(LayerWeights):
    """A dense-MLP layer (Llama's leaves; wv [D, KV, Kv], wo [H, Kv, D]) and, when it slides, its sinks."""

    sinks: jax.Array | None = None  # [H]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MoELayerWeights(Glm4MoeLayerWeights):
    """An MoE layer (GLM-4.5's leaves, no shared experts; wv and wo as above) and, when it slides, its sinks."""

    sinks: jax.Array | None = None  # [H]


def abstract_layer(cfg: ModelConfig, layer: int) -> DenseLayerWeights | MoELayerWeights:
    """Layer `layer`'s leaves: GLM-4.5's (its MLP dense or routed) with the layer's kv heads, values v_head_dim wide,
    and sinks on a sliding layer."""
    D, H, Kv = cfg.hidden_size, cfg.num_heads, cfg.v_head_dim
    KV, K = cfg.kv_shape(layer)
    base = glm4_moe_layer(cfg, layer)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    fields.update(wk=ArrayInfo((D, KV, K), ("embed", "kv_heads", "head_dim")),
                  wv=ArrayInfo((D, KV, Kv), ("embed", "kv_heads", "head_dim")),
                  wo=ArrayInfo((H, Kv, D), ("q_heads", "head_dim", "embed")),
                  sinks=ArrayInfo((H,), ("q_heads",)) if cfg.layer_windows[layer] else None)
    return (MoELayerWeights if cfg.is_moe_layer(layer) else DenseLayerWeights)(**fields)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """GLM-4.5's names (no shared experts), at the full layers' kv heads (`layer_hf_leaves`: the sliding ones')."""
    H, Kv, D = cfg.num_heads, cfg.v_head_dim, cfg.hidden_size
    return {**glm4_moe_hf_leaves(cfg), **_kv_leaves(cfg, cfg.num_kv_heads),
            "wo": HFLeaf(ATTN + "o_proj.weight", "out_heads", (D, H * Kv), H, Kv),
            "sinks": HFLeaf(ATTN + "attention_sink_bias", "same", (H,))}  # transformers: `sinks`


def layer_hf_leaves(cfg: ModelConfig, layer: int) -> dict[str, HFLeaf]:
    """A sliding layer's k and v projections (twice the full layers' kv heads)."""
    heads = cfg.kv_shape(layer)[0]
    return _kv_leaves(cfg, heads) if heads != cfg.num_kv_heads else {}


def _kv_leaves(cfg: ModelConfig, heads: int) -> dict[str, HFLeaf]:
    D, K, Kv = cfg.hidden_size, cfg.head_dim, cfg.v_head_dim
    return {"wk": HFLeaf(ATTN + "k_proj.weight", "in_heads", (heads * K, D), heads, K),
            "wv": HFLeaf(ATTN + "v_proj.weight", "in_heads", (heads * Kv, D), heads, Kv)}


def attention(cfg: ModelConfig, h: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array,
              rope: CosSin) -> tuple[jax.Array, Any]:
    """Attention of the normed input h [B, T, D]: scaled values padded to the key width for the cache, the
    padding's (zero) output columns dropped before wo."""
    layout = cache.layout
    q, k, v = linears(h, [lw.wq, lw.wk, lw.wv])
    q, k = apply_rope(layout.constrain(q, Q_HEADS), *rope), apply_rope(layout.constrain(k, KV_HEADS), *rope)
    width = v.shape[-1]
    v = v * jnp.asarray(cfg.value_scale, v.dtype)
    v = jnp.pad(v, ((0, 0), (0, 0), (0, 0), (0, k.shape[-1] - width)))
    cache = cache.write(layer, k, layout.constrain(v, KV_HEADS), positions)
    attn = attend(q, cache, layer, positions, cfg.layer_windows[layer], sinks=lw.sinks)
    return linear(layout.constrain(attn[..., :width], Q_HEADS), lw.wo, contract=2), cache


def decoder_layer(cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array,
                  rope: RopeTables) -> tuple[jax.Array, Any]:
    """One pre-norm block: the attention above, then the dense MLP or the routed experts."""
    layout = cache.layout
    out, cache = attention(cfg, rms_norm(x, lw.attn_norm, cfg.rms_norm_eps), cache, lw, layer, positions,
                           rope.for_layer(layer))
    x = layout.constrain(x + out, HIDDEN)
    h = rms_norm(x, lw.mlp_norm, cfg.rms_norm_eps)
    mlp = gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation) if isinstance(lw, DenseLayerWeights) \
        else moe_block(h, lw, cfg, layout)
    return layout.constrain(x + mlp, HIDDEN), cache


FAMILY = Family("mimo_v2_flash", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                layer_hf_leaves=layer_hf_leaves)
