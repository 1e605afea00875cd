"""Cohere's Command R7B and Command A (Cohere2ForCausalLM): attention and the MLP side by side off one LayerNorm.

Each layer norms its input once with a bias-free LayerNorm (mean subtracted, `layer_norm_eps`;
`cfg.layer_norm`, the final norm too) and adds attention and the gated MLP of that one normed input
to the residual stream together. Sliding layers (`layer_types`, else all but every
`sliding_window_pattern`-th, 4 by default) attend over `sliding_window` tokens and rotate q and k
in adjacent pairs of dims (`cfg.rope_interleaved`); the full-attention layers take no positional
embedding (`cfg.nope_layers`). The logits are multiplied by `logit_scale` (`cfg.logits_scaling` is
its inverse). Fields a config leaves out take transformers' Cohere2Config defaults.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping

import jax

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields
from jaxinfer.models.exaone4 import sliding_layers
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import Weight
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.mlp import gated_mlp, mlp_hf_leaves, mlp_leaves
from jaxinfer.models.norms import config_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, attention_hf_leaves, attention_leaves, self_attention
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("Cohere2ForCausalLM",)
# Cohere2Config's defaults for fields a config leaves out.
DEFAULTS = dict(logit_scale=0.0625, max_position_embeddings=8192, layer_norm_eps=1e-5, bos_token_id=5,
                eos_token_id=255001, tie_word_embeddings=True, sliding_window=4096, sliding_window_pattern=4)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ParallelLayerWeights:
    """One Cohere 2 layer: one input norm, then attention and the MLP of the same normed input."""

    attn_norm: jax.Array  # [D]
    wq: Weight  # [D, H, K]
    wk: Weight  # [D, KV, K]
    wv: Weight  # [D, KV, K]
    wo: Weight  # [H, K, D]
    w_gate: Weight  # [D, F]
    w_up: Weight  # [D, F]
    w_down: Weight  # [F, D]
    bq: jax.Array | None = None  # [H, K]
    bk: jax.Array | None = None  # [KV, K]
    bv: jax.Array | None = None  # [KV, K]
    bo: jax.Array | None = None  # [D]
    q_norm: jax.Array | None = None  # [H, K]: Command R's per-head LayerNorms (use_qk_norm); Cohere 2 has none
    k_norm: jax.Array | None = None  # [KV, K]

    PROJECTIONS: ClassVar[dict[str, int]] = LayerWeights.PROJECTIONS
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = LayerWeights.JOINED


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> ParallelLayerWeights:
    """One layer's leaves as ArrayInfos."""
    D = cfg.hidden_size
    return ParallelLayerWeights(attn_norm=ArrayInfo((D,), ("embed",), init_value=1.0), **attention_leaves(cfg),
                                **mlp_leaves(D, cfg.intermediate_size))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives in an HF checkpoint."""
    D = cfg.hidden_size
    return {
        "attn_norm": HFLeaf("model.layers.{i}.input_layernorm.weight", "same", (D,)),
        **attention_hf_leaves(cfg),
        **mlp_hf_leaves(D, cfg.intermediate_size),
    }


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: ParallelLayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """x + attention(norm(x)) + MLP(norm(x))."""
    mlp = lambda h: gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation)  # noqa: E731
    return parallel_layer(cfg, x, cache, lw, layer, positions, rope, mlp)


def parallel_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: RopeTables,
    mlp: Callable[[jax.Array], jax.Array],
) -> tuple[jax.Array, Any]:
    """x + attention(norm(x)) + mlp(norm(x)): one norm of the config's kind (Cohere 2's LayerNorm, Cohere2-MoE's
    RMSNorm where it sets rms_norm_eps) feeding both."""
    h = config_norm(x, lw.attn_norm, None, cfg)
    attn, cache = self_attention(cfg, h, cache, lw, layer, positions, rope.for_layer(layer))
    return cache.layout.constrain(x + attn + mlp(h), HIDDEN), cache


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Command R7B / Command A HF config."""
    hf = {**DEFAULTS, **hf}
    fields = common_fields(hf, arch)
    window, scale = hf["sliding_window"], hf["logit_scale"]
    if window is None or int(window) < 1:
        raise ConfigError(f"sliding_window {window!r} is not supported for {arch}: an integer >= 1 (transformers "
                          "runs a null window's sliding layers without rotary embeddings or a window)")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0:
        raise ConfigError(f"logit_scale {scale!r} is not supported for {arch}: a number > 0")
    sliding = sliding_layers(hf, fields["num_layers"])
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        **{**fields, "rms_norm_eps": float(hf["layer_norm_eps"])},
        layer_norm=True,
        qkv_bias=bias,
        o_bias=bias,
        rope_interleaved=True,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        logits_scaling=1.0 / float(scale),
        layer_windows=tuple(int(window) if s else 0 for s in sliding),
        nope_layers=tuple(i for i, s in enumerate(sliding) if not s),
    )


FAMILY = Family("cohere2", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
