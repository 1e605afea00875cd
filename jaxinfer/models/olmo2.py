"""OLMo 2 and OLMo 3 (AI2's fully open models): the Llama layer with its norms moved after each sublayer.

Each sublayer's output is normed before the residual add (`post_attention_layernorm`,
`post_feedforward_layernorm`) and its input is not normed at all; the q/k norms span every
head's dims at once (RMSNorm over the whole q or k projection, `cfg.qk_norm_whole`), not one head.
OLMo 3 adds sliding-window layers (`layer_types`; by default three of every four) whose rope is
unscaled, `rope_scaling` applying to the full-attention layers only, as transformers reads it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.config.layer_type_rope import layer_type_rope
from jaxinfer.config.model import (
    ConfigError,
    ModelConfig,
    activation_name,
    common_fields,
    field,
    layer_types,
    uniform_windows,
)
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import Weight
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.mlp import gated_mlp, mlp_hf_leaves, mlp_leaves
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, attention_hf_leaves, attention_leaves, self_attention
from jaxinfer.parallel.array_info import ArrayInfo

OLMO3 = "Olmo3ForCausalLM"
ARCHITECTURES = ("Olmo2ForCausalLM", OLMO3)
OLMO3_THETA = 500_000.0  # transformers' default for both layer types


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PostNormLayerWeights:
    """One OLMo 2 layer: attention and the MLP, each followed by a norm of its output."""

    wq: Weight  # [D, H, K]
    wk: Weight  # [D, KV, K]
    wv: Weight  # [D, KV, K]
    wo: Weight  # [H, K, D]
    q_norm: jax.Array  # [H, K]: one RMSNorm over all of q's heads
    k_norm: jax.Array  # [KV, K]
    post_attn_norm: jax.Array  # [D]
    w_gate: Weight  # [D, F]
    w_up: Weight  # [D, F]
    w_down: Weight  # [F, D]
    post_mlp_norm: jax.Array  # [D]
    bq: jax.Array | None = None  # [H, K]
    bk: jax.Array | None = None  # [KV, K]
    bv: jax.Array | None = None  # [KV, K]
    bo: jax.Array | None = None  # [D]

    PROJECTIONS: ClassVar[dict[str, int]] = LayerWeights.PROJECTIONS
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = LayerWeights.JOINED


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> PostNormLayerWeights:
    """One layer's leaves as ArrayInfos."""
    D = cfg.hidden_size
    norms = {name: ArrayInfo((D,), ("embed",), init_value=1.0) for name in ("post_attn_norm", "post_mlp_norm")}
    return PostNormLayerWeights(**norms, **attention_leaves(cfg), **mlp_leaves(D, cfg.intermediate_size))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives in an HF checkpoint."""
    D, layer = cfg.hidden_size, "model.layers.{i}."
    return {
        "post_attn_norm": HFLeaf(layer + "post_attention_layernorm.weight", "same", (D,)),
        "post_mlp_norm": HFLeaf(layer + "post_feedforward_layernorm.weight", "same", (D,)),
        **attention_hf_leaves(cfg),
        **mlp_hf_leaves(D, cfg.intermediate_size),
    }


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: PostNormLayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """attention -> norm -> residual add, then MLP -> norm -> residual add."""
    layout, eps = cache.layout, cfg.rms_norm_eps
    out, cache = self_attention(cfg, x, cache, lw, layer, positions, rope.for_layer(layer))
    x = layout.constrain(x + rms_norm(out, lw.post_attn_norm, eps), HIDDEN)
    h = gated_mlp(x, lw.w_gate, lw.w_up, lw.w_down, cfg.activation)
    return layout.constrain(x + rms_norm(h, lw.post_mlp_norm, eps), HIDDEN), cache


def _olmo3_windows(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """`sliding_window` on the sliding layers of `layer_types` (transformers' default: all but every 4th)."""
    window = int(field(hf, "sliding_window", 4096))
    types = layer_types(hf, num_layers) or ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention"
                                            for i in range(num_layers)]
    if window < 1 and "sliding_attention" in types:
        raise ConfigError(f"sliding_window {window} must be >= 1 for {OLMO3}'s sliding layers")
    return tuple(window if t == "sliding_attention" else 0 for t in types)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an OLMo 2 (full attention in every layer) or OLMo 3 HF config."""
    fields = common_fields(hf, arch)
    if arch == OLMO3:
        thetas = dict.fromkeys(("full_attention", "sliding_attention"), OLMO3_THETA)
        theta, scaling, local_theta = layer_type_rope(hf, thetas, "rope_theta", arch)
        fields.update(rope_theta=theta, rope_scaling=scaling, local_rope_theta=local_theta)
    windows = _olmo3_windows(hf, fields["num_layers"]) if arch == OLMO3 else uniform_windows(
        hf, arch, fields["num_layers"], 0)
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        **fields,
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        qk_norm_whole=True,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=windows,
    )


FAMILY = Family("olmo2", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
