"""SmallDoge Doge (`DogeForCausalLM`): Llama's layer with Dynamic Mask Attention and per-channel residual weights.

As transformers' modular_doge has it:

- Attention: per-head q/k RMSNorms before the rotation; every score of a query gets its key's bias added,
  exp(A * softplus(dt_proj(v))) per key and K/V head (`A` [KV], `dt_proj` [KV * K -> KV] over the key's values of
  all heads). Past `keep_window_size` keys only each query's keep_window_size keys with the largest bias stay; a
  context that long is refused here (`max_position_embeddings` above keep_window_size): the pages keep every key.
- Each residual add weighs the residual per channel: input_residual * x + attention, post_attention_residual * x +
  MLP.

The bias rides in the keys: the cache holds heads 2K wide (`cfg.head_dim`, DiffLlama's way), each key [k, bias /
scale, 0...] and each query [q, 1, 0...], so q'.k' * scale = q.k * scale + bias in every kernel and page layout, for
twice the K/V bytes of K-wide heads. `is_moe` (the cross-domain MoE: product-key retrieval of single-neuron experts;
transformers' full-forward routing also splits its router logits across tokens) is refused by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, uniform_windows
from jaxinfer.models.attention import attend
from jaxinfer.models.diffllama import key_config, padded
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.llama import abstract_layer as llama_abstract_layer
from jaxinfer.models.llama import hf_leaves as llama_hf_leaves
from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import CosSin, RopeTables
from jaxinfer.models.self_attention import HIDDEN, Q_HEADS, project_qkv
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("DogeForCausalLM",)
# DogeConfig's defaults for the fields a config may leave out (or null) where ours differ.
DEFAULTS = dict(vocab_size=32768, hidden_size=1024, intermediate_size=2048, num_hidden_layers=32,
                num_attention_heads=8, max_position_embeddings=2048, rms_norm_eps=1e-6, keep_window_size=2048,
                is_moe=False, attention_bias=False)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class DogeLayer(LayerWeights):
    """Llama's layer with the dynamic mask's leaves and the residual weights."""

    dt_proj: Weight  # [KV * K, KV]
    dt_scale: jax.Array  # [KV] A
    attn_residual: jax.Array  # [D] input_residual
    mlp_residual: jax.Array  # [D] post_attention_residual
    dt_bias: jax.Array | None = None  # [KV] with attention_bias

    PROJECTIONS: ClassVar[dict[str, int]] = {**LayerWeights.PROJECTIONS, "dt_proj": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = LayerWeights.JOINED


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> DogeLayer:
    """Llama's leaves at K-wide heads (q/k norms on), the dynamic mask's and the residual weights."""
    narrow = key_config(cfg)
    base = llama_abstract_layer(narrow, layer)
    D, KV, K = cfg.hidden_size, cfg.num_kv_heads, narrow.head_dim
    return DogeLayer(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                     dt_proj=ArrayInfo((KV * K, KV), (None, None)), dt_scale=ArrayInfo((KV,), (None,)),
                     attn_residual=ArrayInfo((D,), ("embed",), init_value=1.0),
                     mlp_residual=ArrayInfo((D,), ("embed",), init_value=1.0),
                     dt_bias=ArrayInfo((KV,), (None,)) if cfg.qkv_bias else None)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Llama's names at K-wide heads with the dynamic mask's and the residual weights'."""
    KV, K, D = cfg.num_kv_heads, cfg.head_dim // 2, cfg.hidden_size
    attn, layer = "model.layers.{i}.self_attn.", "model.layers.{i}."
    leaves = {
        **llama_hf_leaves(key_config(cfg)),
        "dt_proj": HFLeaf(attn + "dt_proj.weight", "transpose", (KV, KV * K)),
        "dt_scale": HFLeaf(attn + "A", "same", (KV,)),
        "attn_residual": HFLeaf(layer + "input_residual", "same", (D,)),
        "mlp_residual": HFLeaf(layer + "post_attention_residual", "same", (D,)),
    }
    return leaves | ({"dt_bias": HFLeaf(attn + "dt_proj.bias", "same", (KV,))} if cfg.qkv_bias else {})


def key_bias(v: jax.Array, lw: DogeLayer) -> jax.Array:
    """Each key's bias per K/V head [B, T, KV] from its values v [B, T, KV, K]: exp(A * softplus(dt_proj(v)))."""
    dt = linear(v.reshape(*v.shape[:2], -1), lw.dt_proj)
    if lw.dt_bias is not None:
        dt = dt + lw.dt_bias.astype(dt.dtype)
    return jnp.exp(lw.dt_scale.astype(dt.dtype) * jax.nn.softplus(dt))


def dynamic_mask_attention(cfg: ModelConfig, h: jax.Array, cache: Any, lw: DogeLayer, layer: int,
                           positions: jax.Array, rope: CosSin | None) -> tuple[jax.Array, Any]:
    """Attention of the normed input h [B, T, D] with each key's bias added to its scores: [B, T, D]."""
    layout, narrow, width = cache.layout, key_config(cfg), cfg.head_dim
    q, k, v = project_qkv(h, lw, narrow, rope, layout)
    K = narrow.head_dim
    bias = key_bias(v, lw) * jnp.asarray(K ** 0.5, h.dtype)  # over the scale K ** -0.5 the scores take
    keys = padded(jnp.concatenate([k, bias[..., None]], axis=-1), width)
    queries = padded(jnp.concatenate([q, jnp.ones_like(q[..., :1])], axis=-1), width)
    cache = cache.write(layer, keys, padded(v, width), positions)
    out = attend(queries, cache, layer, positions, cfg.layer_windows[layer], scale=cfg.attn_scale)[..., :K]
    attn = linear(layout.constrain(out, Q_HEADS), lw.wo, contract=2)
    return (attn if lw.bo is None else attn + lw.bo), cache


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: DogeLayer, layer: int, positions: jax.Array, rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """Llama's pre-norm block with the dynamic mask attention and the residual weighed per channel."""
    layout, eps = cache.layout, cfg.rms_norm_eps
    out, cache = dynamic_mask_attention(cfg, rms_norm(x, lw.attn_norm, eps), cache, lw, layer, positions,
                                        rope.for_layer(layer))
    x = layout.constrain(lw.attn_residual.astype(x.dtype) * x + out, HIDDEN)
    h = gated_mlp(rms_norm(x, lw.mlp_norm, eps), lw.w_gate, lw.w_up, lw.w_down, cfg.activation)
    return layout.constrain(lw.mlp_residual.astype(x.dtype) * x + h, HIDDEN), cache


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Doge HF config: the cache's heads 2 * head_dim wide (fields it leaves out or nulls take
    DogeConfig's defaults)."""
    hf = {**DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    if hf["is_moe"]:
        raise ConfigError(f"is_moe=True is not supported for {arch}: its cross-domain MoE retrieves num_experts "
                          "single-neuron experts by product keys (and transformers' full-forward routing mixes router "
                          "logits across tokens); the dense Doge models run")
    keep, context = int(hf["keep_window_size"]), int(hf["max_position_embeddings"])
    if context > keep:
        raise ConfigError(f"max_position_embeddings {context} above keep_window_size {keep} is not supported for "
                          f"{arch}: past keep_window_size keys the dynamic mask keeps each query's top keys by bias, "
                          "which the paged attention does not choose")
    fields = common_fields(hf, arch)
    K, bias = fields["head_dim"], bool(hf["attention_bias"])
    return ModelConfig(
        **{**fields, "head_dim": 2 * K},
        rotary_dim=K, attn_scale=K ** -0.5, qkv_bias=bias, o_bias=bias, qk_norm=True,
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], int(hf.get("sliding_window") or 0)),
        activation=activation_name(hf.get("hidden_act") or "silu"),
    )


FAMILY = Family("doge", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
