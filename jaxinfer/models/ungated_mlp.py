"""The ungated MLP, down(act(x @ up)), and the pre-norm layer around it (Arcee).

Arcee squares a ReLU (`relu2`) where Llama gates: one projection up, one down, so the layer has
`w_up` and `w_down` and no `w_gate`; attention and the norms are Llama's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.family import HFLeaf
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.mlp import activation
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, attention_hf_leaves, attention_leaves, self_attention
from jaxinfer.parallel.array_info import ArrayInfo


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class UngatedLayerWeights:
    """One pre-norm layer: attention, then an ungated MLP."""

    attn_norm: jax.Array  # [D]
    wq: Weight  # [D, H, K]
    wk: Weight  # [D, KV, K]
    wv: Weight  # [D, KV, K]
    wo: Weight  # [H, K, D]
    mlp_norm: jax.Array  # [D]
    w_up: Weight  # [D, F]
    w_down: Weight  # [F, D]
    bq: jax.Array | None = None  # [H, K]
    bk: jax.Array | None = None  # [KV, K]
    bv: jax.Array | None = None  # [KV, K]
    bo: jax.Array | None = None  # [D]
    q_norm: None = None  # self_attention's optional fields; these families have no q/k norms
    k_norm: None = None

    PROJECTIONS: ClassVar[dict[str, int]] = {"wq": 1, "wk": 1, "wv": 1, "wo": 2, "w_up": 1, "w_down": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("wq", "wk", "wv"),)


def ungated_mlp(x: jax.Array, up: Weight, down: Weight, act: str) -> jax.Array:
    """down(act(x @ up)), weights stored [in, out]; the activation in float32, rounded once (see gate_product)."""
    h = linear(x, up)
    return linear(activation(act, h.astype(jnp.float32)).astype(h.dtype), down)


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> UngatedLayerWeights:
    """One layer's leaves as ArrayInfos."""
    D, F = cfg.hidden_size, cfg.intermediate_size
    return UngatedLayerWeights(
        attn_norm=ArrayInfo((D,), ("embed",), init_value=1.0),
        mlp_norm=ArrayInfo((D,), ("embed",), init_value=1.0),
        w_up=ArrayInfo((D, F), ("embed", "mlp")),
        w_down=ArrayInfo((F, D), ("mlp", "embed")),
        **attention_leaves(cfg),
    )


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives in a Llama-named checkpoint (`mlp.up_proj`, `mlp.down_proj`)."""
    D, F, layer = cfg.hidden_size, cfg.intermediate_size, "model.layers.{i}."
    return {
        "attn_norm": HFLeaf(layer + "input_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf(layer + "post_attention_layernorm.weight", "same", (D,)),
        "w_up": HFLeaf(layer + "mlp.up_proj.weight", "transpose", (F, D)),
        "w_down": HFLeaf(layer + "mlp.down_proj.weight", "transpose", (D, F)),
        **attention_hf_leaves(cfg),
    }


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: UngatedLayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """Pre-norm attention, then the pre-norm ungated MLP, each added to the residual stream."""
    layout, eps = cache.layout, cfg.rms_norm_eps
    out, cache = self_attention(cfg, rms_norm(x, lw.attn_norm, eps), cache, lw, layer, positions,
                                rope.for_layer(layer))
    x = layout.constrain(x + out, HIDDEN)
    h = ungated_mlp(rms_norm(x, lw.mlp_norm, eps), lw.w_up, lw.w_down, cfg.activation)
    return layout.constrain(x + h, HIDDEN), cache
