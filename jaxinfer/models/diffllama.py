"""DiffLlama (`DiffLlamaForCausalLM`): Llama's layer with differential attention (arXiv 2410.05258).

transformers' DiffLlamaAttention: q, k, v and rotary as Llama's (K = head_dim), then two softmax attentions sharing
q and k, over the two halves of the value heads (head g reads values g mod KV/2 and KV/2 + g mod KV/2); their
outputs side by side per query head [H, 2K], the first H/2 heads minus lambda times the last H/2, each pair
RMS-normed over its 2K dims without a weight, times 1 - lambda_init, then o_proj. lambda = exp(lambda_q1 .
lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init, lambda_init = 0.8 - 0.6 exp(-0.3 layer).

One attention computes both: the cache holds heads 2K wide (`cfg.head_dim`), keys zero-padded from K (scores
unchanged; the scale is K ** -0.5, rotary over the first K) and each K/V head's value pair side by side, so every
kernel and page layout runs it as it runs any GQA layer, for twice the K/V bytes of K-wide heads. lambda_init
depends on the layer's index, which a one-layer trace does not see: it is put into the layer's weights as it runs
(`Family.borrowed_leaves`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.models.attention import attend
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import linear
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.llama import abstract_layer as llama_abstract_layer
from jaxinfer.models.llama import hf_leaves as llama_hf_leaves
from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import CosSin, RopeTables
from jaxinfer.models.self_attention import HIDDEN, Q_HEADS, project_qkv
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("DiffLlamaForCausalLM",)
LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class DiffLayerWeights(LayerWeights):
    """Llama's layer with the differential attention's lambda vectors."""

    lambda_q1: jax.Array  # [K]
    lambda_k1: jax.Array  # [K]
    lambda_q2: jax.Array  # [K]
    lambda_k2: jax.Array  # [K]
    lambda_init: jax.Array | None = None  # []: 0.8 - 0.6 exp(-0.3 layer), put in as the layer runs; None stored

    PROJECTIONS: ClassVar[dict[str, int]] = LayerWeights.PROJECTIONS
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = LayerWeights.JOINED


def key_config(cfg: ModelConfig) -> ModelConfig:
    """cfg with q, k and v's own head width K (half the cached 2K)."""
    return dataclasses.replace(cfg, head_dim=cfg.head_dim // 2, rotary_dim=0)


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> DiffLayerWeights:
    """Llama's leaves at K-wide heads, and the four lambda vectors."""
    narrow = key_config(cfg)
    base = llama_abstract_layer(narrow, layer)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    lambdas = {name: ArrayInfo((narrow.head_dim,), ("head_dim",), init_std=0.1) for name in LAMBDAS}
    return DiffLayerWeights(**fields, **lambdas)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Llama's tensor names at K-wide heads, and the lambda vectors beside q_proj."""
    K = cfg.head_dim // 2
    return {**llama_hf_leaves(key_config(cfg)),
            **{name: HFLeaf(f"model.layers.{{i}}.self_attn.{name}", "same", (K,)) for name in LAMBDAS}}


def with_lambda_init(cfg: ModelConfig, layers: list[Any], layer: int) -> DiffLayerWeights:
    """Layer `layer`'s weights as it runs, its lambda_init put in (traced: one trace serves every layer)."""
    return dataclasses.replace(layers[layer], lambda_init=jnp.asarray(0.8 - 0.6 * math.exp(-0.3 * layer),
                                                                      jnp.float32))


def padded(x: jax.Array, width: int) -> jax.Array:
    """x [..., K] zero-padded to [..., width]."""
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - x.shape[-1])])


def value_pairs(v: jax.Array) -> jax.Array:
    """v [B, T, KV, K] -> [B, T, KV, 2K]: head g's values g mod KV/2 and KV/2 + g mod KV/2 side by side."""
    first, second = jnp.split(v, 2, axis=2)
    return jnp.concatenate([jnp.concatenate([first, first], axis=2), jnp.concatenate([second, second], axis=2)],
                           axis=-1)


def differential_attention(cfg: ModelConfig, h: jax.Array, cache: Any, lw: DiffLayerWeights, layer: int,
                           positions: jax.Array, rope: CosSin | None) -> tuple[jax.Array, Any]:
    """The differential attention of the normed input h [B, T, D] over the cache: [B, T, D]."""
    layout, narrow = cache.layout, key_config(cfg)
    q, k, v = project_qkv(h, lw, narrow, rope, layout)
    width = cfg.head_dim
    cache = cache.write(layer, padded(k, width), value_pairs(v), positions)
    out = attend(padded(q, width), cache, layer, positions, cfg.layer_windows[layer], scale=cfg.attn_scale)
    first, second = jnp.split(out, 2, axis=2)  # [B, T, H/2, 2K] each
    dot = lambda a, b: jnp.exp(jnp.sum(a.astype(jnp.float32) * b.astype(jnp.float32)))  # noqa: E731
    lam = dot(lw.lambda_q1, lw.lambda_k1) - dot(lw.lambda_q2, lw.lambda_k2) + lw.lambda_init
    mixed = first - lam.astype(out.dtype) * second
    normed = rms_norm(mixed, None, cfg.rms_norm_eps) * (1 - lw.lambda_init).astype(out.dtype)
    heads = normed.reshape(*normed.shape[:2], cfg.num_heads, narrow.head_dim)
    attn = linear(layout.constrain(heads, Q_HEADS), lw.wo, contract=2)
    return (attn if lw.bo is None else attn + lw.bo), cache


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: DiffLayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """Llama's pre-norm block with the differential attention."""
    layout = cache.layout
    out, cache = differential_attention(cfg, rms_norm(x, lw.attn_norm, cfg.rms_norm_eps), cache, lw, layer,
                                        positions, rope.for_layer(layer))
    x = layout.constrain(x + out, HIDDEN)
    h = rms_norm(x, lw.mlp_norm, cfg.rms_norm_eps)
    return layout.constrain(x + gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation), HIDDEN), cache


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a DiffLlama HF config: the cache's heads 2 * head_dim wide, rotary over the first head_dim."""
    fields = common_fields(hf, arch)
    kv, dropout = fields["num_kv_heads"], field(hf, "attention_dropout", 0.0)
    if kv % 2:
        raise ConfigError(f"num_key_value_heads {kv} is not supported for {arch}: the differential attention splits "
                          "the value heads in two halves (an even count, as transformers requires)")
    if dropout:
        raise ConfigError(f"attention_dropout {dropout!r} is not supported for {arch} (transformers refuses it too): 0")
    K = fields["head_dim"]
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        **{**fields, "head_dim": 2 * K},
        rotary_dim=K,
        attn_scale=K ** -0.5,
        qkv_bias=bias,
        o_bias=bias,
        activation=activation_name(hf.get("hidden_act") or "silu"),
    )


FAMILY = Family("diffllama", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                borrowed_leaves=with_lambda_init)
