"""The Gemma 2 family: Gemma 2 and Gemma 3 (text).

Beside Gemma's (1 + w) norms, scaled embeddings and tied head: sliding-window layers
alternating with global ones (`layer_types`, or Gemma 2's every other layer and Gemma 3's
`sliding_window_pattern`), a norm after attention and one after the MLP (each before the
residual add), scores scaled by `query_pre_attn_scalar` ** -0.5, and soft-capped attention
scores and output logits (Gemma 2). Gemma 3 adds q/k norms and a RoPE base of its own for the
sliding layers (`rope_local_base_freq`), `rope_scaling` applying to the global layers only.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping

import jax

from jaxinfer.config.layer_type_rope import layer_type_rope
from jaxinfer.config.model import ConfigError, ModelConfig, common_fields, field, layer_types
from jaxinfer.config.typed_windows import windows_by_type
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import Weight
from jaxinfer.models.llama import LayerWeights, gemma_activation
from jaxinfer.models.mlp import gated_mlp, mlp_hf_leaves, mlp_leaves
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, attention_hf_leaves, attention_leaves, self_attention
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

GEMMA2, GEMMA3 = "Gemma2ForCausalLM", "Gemma3ForCausalLM"
VAULTGEMMA = "VaultGemmaForCausalLM"  # Gemma 2's config, read here, in Llama's layer (models.vaultgemma)
# transformers' defaults for fields a config may leave out.
DEFAULTS = {
    GEMMA2: dict(attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window_pattern=2),
    GEMMA3: dict(attn_logit_softcapping=None, final_logit_softcapping=None, sliding_window_pattern=6),
}
DEFAULTS[VAULTGEMMA] = DEFAULTS[GEMMA2]
GEMMA3_THETAS = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SandwichLayerWeights:
    """One Gemma 2/3 layer: each sublayer between an input norm and an output norm."""

    attn_norm: jax.Array  # [D] input_layernorm
    wq: Weight  # [D, H, K]
    wk: Weight  # [D, KV, K]
    wv: Weight  # [D, KV, K]
    wo: Weight  # [H, K, D]
    post_attn_norm: jax.Array  # [D]
    mlp_norm: jax.Array  # [D] pre_feedforward_layernorm
    w_gate: Weight  # [D, F]
    w_up: Weight  # [D, F]
    w_down: Weight  # [F, D]
    post_mlp_norm: jax.Array  # [D]
    bq: jax.Array | None = None  # [H, K]
    bk: jax.Array | None = None  # [KV, K]
    bv: jax.Array | None = None  # [KV, K]
    bo: jax.Array | None = None  # [D]
    q_norm: jax.Array | None = None  # [K] (Gemma 3)
    k_norm: jax.Array | None = None  # [K]

    PROJECTIONS: ClassVar[dict[str, int]] = LayerWeights.PROJECTIONS
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = LayerWeights.JOINED


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> SandwichLayerWeights:
    """One layer's leaves as ArrayInfos (norm weights start at 0: they are stored as w - 1)."""
    D = cfg.hidden_size
    norms = {name: ArrayInfo((D,), ("embed",), init_value=0.0)
             for name in ("attn_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm")}
    return SandwichLayerWeights(**norms, **attention_leaves(cfg), **mlp_leaves(D, cfg.intermediate_size))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives in an HF checkpoint."""
    D, layer = cfg.hidden_size, "model.layers.{i}."
    norms = {
        "attn_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm",
        "mlp_norm": "pre_feedforward_layernorm", "post_mlp_norm": "post_feedforward_layernorm",
    }
    return {
        **{name: HFLeaf(f"{layer}{hf}.weight", "same", (D,)) for name, hf in norms.items()},
        **attention_hf_leaves(cfg),
        **mlp_hf_leaves(D, cfg.intermediate_size),
    }


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: SandwichLayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """norm -> attention -> norm -> residual add, then norm -> MLP -> norm -> residual add."""
    return sandwich_layer(cfg, x, cache, lw, layer, positions, rope,
                          lambda h, layout: gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation))


def sandwich_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: RopeTables,
    mlp: Callable[[jax.Array, Layout], jax.Array],
) -> tuple[jax.Array, Any]:
    """Gemma 2's layer with any MLP (GLM-4's; Kolibri-1's and AFMoE's experts): each sublayer's input and output
    normed (`attn_norm`, `post_attn_norm`, `mlp_norm`, `post_mlp_norm`) before its residual add."""
    layout, eps, offset = cache.layout, cfg.rms_norm_eps, cfg.norm_weight_offset
    h = rms_norm(x, lw.attn_norm, eps, offset)
    out, cache = self_attention(cfg, h, cache, lw, layer, positions, rope.for_layer(layer))
    x = layout.constrain(x + rms_norm(out, lw.post_attn_norm, eps, offset), HIDDEN)
    h = mlp(rms_norm(x, lw.mlp_norm, eps, offset), layout)
    return layout.constrain(x + rms_norm(h, lw.post_mlp_norm, eps, offset), HIDDEN), cache


def _windows(hf: Mapping[str, Any], arch: str, num_layers: int) -> tuple[int, ...]:
    """Per-layer windows: `layer_types`, else transformers' pattern (every `pattern`-th layer global)."""
    window = int(field(hf, "sliding_window", 4096))
    types = layer_types(hf, num_layers)
    if types is None:
        pattern = int(field(hf, "sliding_window_pattern", DEFAULTS[arch]["sliding_window_pattern"]))
        if pattern < 1:
            raise ConfigError(f"sliding_window_pattern {pattern} must be >= 1 (every pattern-th layer is global)")
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    return windows_by_type(types, window, arch)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Gemma 2 or Gemma 3 (text) HF config."""
    if hf.get("use_bidirectional_attention"):
        raise ConfigError(f"use_bidirectional_attention=True ({arch} as an encoder) is not supported; "
                          "jaxinfer runs causal decoders")
    fields = common_fields(hf, arch)
    if arch == GEMMA3:
        theta, scaling, local_theta = layer_type_rope(hf, GEMMA3_THETAS, "rope_local_base_freq", arch)
        fields.update(rope_theta=theta, rope_scaling=scaling, local_rope_theta=local_theta)
    defaults = DEFAULTS[arch]
    caps = {name: field(hf, name, defaults[name]) for name in ("attn_logit_softcapping", "final_logit_softcapping")}
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        **{**fields, "head_dim": int(field(hf, "head_dim", 256)),
           "tie_word_embeddings": bool(hf.get("tie_word_embeddings", True))},
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=arch == GEMMA3,
        activation=gemma_activation(hf),
        norm_weight_offset=1.0,
        scale_embeddings=True,
        layer_windows=_windows(hf, arch, fields["num_layers"]),
        attn_scale=float(field(hf, "query_pre_attn_scalar", 256)) ** -0.5,
        attn_soft_cap=None if caps["attn_logit_softcapping"] is None else float(caps["attn_logit_softcapping"]),
        final_soft_cap=None if caps["final_logit_softcapping"] is None else float(caps["final_logit_softcapping"]),
    )


FAMILY = Family("gemma2", (GEMMA2, GEMMA3), read_config, abstract_layer, hf_leaves, decoder_layer)
