"""The ungated MLP, down(act(x @ up + b_up)) + b_down, and the pre-norm layer around it (Arcee, Nemotron, StarCoder2,
GPT-NeoX, Phi).

Arcee and Nemotron square a ReLU (`relu2`) and StarCoder2 runs GELU where Llama gates: one
projection up, one down, so the layer has `w_up` and `w_down` and no `w_gate`. Arcee's norms are
RMSNorms; StarCoder2's and Nemotron's LayerNorms (`cfg.layer_norm`) with biases (`cfg.norm_bias`),
Nemotron's weights stored less 1 (`cfg.norm_weight_offset`). StarCoder2 biases both projections
(`cfg.mlp_bias`). With `cfg.parallel_residual` attention and the MLP both read the layer's input and
are added to it together (GPT-NeoX: each through its own norm; Phi: one norm, `mlp_norm` None). StableLM runs
the same residual structure around a gated MLP (`norm_layer` takes the MLP).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.family import HFLeaf
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.mlp import activation
from jaxinfer.models.norms import config_norm
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
    mlp_norm: jax.Array | None  # [D]; None: the MLP reads attention's normed input (Phi's one norm)
    w_up: Weight  # [D, F]
    w_down: Weight  # [F, D]
    attn_norm_bias: jax.Array | None = None  # [D]
    mlp_norm_bias: jax.Array | None = None  # [D]
    b_up: jax.Array | None = None  # [F]
    b_down: jax.Array | None = None  # [D]
    bq: jax.Array | None = None  # [H, K]
    bk: jax.Array | None = None  # [KV, K]
    bv: jax.Array | None = None  # [KV, K]
    bo: jax.Array | None = None  # [D]
    q_norm: jax.Array | None = None  # [K]: Phi's q/k LayerNorms (qk_layernorm), one head's dims, with biases
    k_norm: jax.Array | None = None  # [K]
    q_norm_bias: jax.Array | None = None  # [K]
    k_norm_bias: jax.Array | None = None  # [K]

    PROJECTIONS: ClassVar[dict[str, int]] = {"wq": 1, "wk": 1, "wv": 1, "wo": 2, "w_up": 1, "w_down": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("wq", "wk", "wv"),)


def biased_linear(x: jax.Array, w: Weight, bias: jax.Array | None) -> jax.Array:
    """x @ w + bias, the bias added in float32 before the one rounding to x's dtype (as torch's addmm)."""
    if bias is None:
        return linear(x, w)
    return (linear(x, w, out_dtype=jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def ungated_mlp(x: jax.Array, lw: UngatedLayerWeights, act: str) -> jax.Array:
    """down(act(x @ up + b_up)) + b_down; the activation in float32, rounded once (see mlp.gate_product)."""
    h = biased_linear(x, lw.w_up, lw.b_up)
    return biased_linear(activation(act, h.astype(jnp.float32)).astype(h.dtype), lw.w_down, lw.b_down)


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> UngatedLayerWeights:
    """One layer's leaves as ArrayInfos."""
    D, F = cfg.hidden_size, cfg.intermediate_size
    norm = ArrayInfo((D,), ("embed",), init_value=0.0 if cfg.norm_weight_offset else 1.0)
    norm_bias = ArrayInfo((D,), ("embed",)) if cfg.norm_bias else None
    return UngatedLayerWeights(
        attn_norm=norm,
        mlp_norm=norm,
        w_up=ArrayInfo((D, F), ("embed", "mlp")),
        w_down=ArrayInfo((F, D), ("mlp", "embed")),
        attn_norm_bias=norm_bias,
        mlp_norm_bias=norm_bias,
        b_up=ArrayInfo((F,), ("mlp",)) if cfg.mlp_bias else None,
        b_down=ArrayInfo((D,), ("embed",)) if cfg.mlp_bias else None,
        **attention_leaves(cfg),
    )


def hf_leaves(cfg: ModelConfig, up: str = "up_proj", down: str = "down_proj") -> dict[str, HFLeaf]:
    """Where each layer field lives: Llama's norm names, the MLP's projections `mlp.{up}`, `mlp.{down}`."""
    D, F, layer = cfg.hidden_size, cfg.intermediate_size, "model.layers.{i}."
    norms = {"attn_norm": layer + "input_layernorm.", "mlp_norm": layer + "post_attention_layernorm."}
    leaves = {
        **{field: HFLeaf(name + "weight", "same", (D,)) for field, name in norms.items()},
        "w_up": HFLeaf(f"{layer}mlp.{up}.weight", "transpose", (F, D)),
        "w_down": HFLeaf(f"{layer}mlp.{down}.weight", "transpose", (D, F)),
        **attention_hf_leaves(cfg),
    }
    if cfg.norm_bias:
        leaves.update({field + "_bias": HFLeaf(name + "bias", "same", (D,)) for field, name in norms.items()})
    if cfg.mlp_bias:
        leaves["b_up"] = HFLeaf(f"{layer}mlp.{up}.bias", "same", (F,))
        leaves["b_down"] = HFLeaf(f"{layer}mlp.{down}.bias", "same", (D,))
    return leaves


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: UngatedLayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """Pre-norm attention, then the pre-norm ungated MLP, each added to the residual stream; with
    `cfg.parallel_residual` both read x: x + attention(norm(x)) + MLP(norm'(x)) (norm' = norm without mlp_norm)."""
    return norm_layer(cfg, x, cache, lw, layer, positions, rope, ungated_mlp)


def norm_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: UngatedLayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables, mlp: Callable[[jax.Array, Any, str], jax.Array],
) -> tuple[jax.Array, Any]:
    """`decoder_layer` with the MLP `mlp(h, lw, activation)` (StableLM's gated one)."""
    layout = cache.layout
    h = config_norm(x, lw.attn_norm, lw.attn_norm_bias, cfg)
    out, cache = self_attention(cfg, h, cache, lw, layer, positions, rope.for_layer(layer))
    if cfg.parallel_residual:
        mlp_in = h if lw.mlp_norm is None else config_norm(x, lw.mlp_norm, lw.mlp_norm_bias, cfg)
        return layout.constrain(x + out + mlp(mlp_in, lw, cfg.activation), HIDDEN), cache
    x = layout.constrain(x + out, HIDDEN)
    h = mlp(config_norm(x, lw.mlp_norm, lw.mlp_norm_bias, cfg), lw, cfg.activation)
    return layout.constrain(x + h, HIDDEN), cache
