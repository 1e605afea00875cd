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
Multi-token-prediction weights (`model.mtp.*`) are not run, and not read.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, layer_type_rope
from jaxinfer.models.attention import attend
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.glm import rotary_dim
from jaxinfer.models.glm4_moe import Glm4MoeLayerWeights, moe_block
from jaxinfer.models.glm4_moe import abstract_layer as glm4_moe_layer
from jaxinfer.models.glm4_moe import hf_leaves as glm4_moe_hf_leaves
from jaxinfer.models.grouped_topk import check_groups
from jaxinfer.models.layers import linear, linears
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import CosSin, RopeTables, apply_rope
from jaxinfer.models.self_attention import HIDDEN, KV_HEADS, Q_HEADS
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("MiMoV2FlashForCausalLM",)
ATTN = "model.layers.{i}.self_attn."
# MiMoV2FlashConfig's defaults for the fields a config leaves out (or nulls) that differ from ours.
HF_DEFAULTS = dict(vocab_size=152576, hidden_size=4096, intermediate_size=16384, num_hidden_layers=48,
                   num_attention_heads=64, num_key_value_heads=4, head_dim=192, v_head_dim=128, rms_norm_eps=1e-5,
                   max_position_embeddings=131072, moe_intermediate_size=2048, num_experts_per_tok=8,
                   n_routed_experts=256, routed_scaling_factor=1.0, n_group=1, topk_group=1, norm_topk_prob=True,
                   sliding_window=129, attention_value_scale=0.707, attention_bias=False, bos_token_id=1)
THETAS = {"full_attention": 5_000_000.0, "sliding_attention": 10_000.0}
PARTIAL_ROTARY_FACTOR = 0.334


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


def _layer_kinds(hf: Mapping[str, Any], num_layers: int) -> tuple[list[str], list[str]]:
    """(attention kind, MLP kind) per layer: the config's lists, else MiMoV2FlashConfig's (full first and every
    6th; dense first)."""
    kinds = hf.get("layer_types") or ["full_attention" if i == 0 or (i + 1) % 6 == 0 else "sliding_attention"
                                      for i in range(num_layers)]
    mlps = hf.get("mlp_layer_types") or ["dense"] + ["sparse"] * (num_layers - 1)
    for name, value, accepted in (("layer_types", kinds, {"full_attention", "sliding_attention"}),
                                  ("mlp_layer_types", mlps, {"dense", "sparse"})):
        if len(value) != num_layers or not set(value) <= accepted:
            raise ConfigError(f"{name} {value!r} must list one of {sorted(accepted)} for each of the {num_layers} "
                              "layers")
    return kinds, mlps


def _rotary_dims(hf: Mapping[str, Any], head_dim: int) -> int:
    """The rotated dims, one partial_rotary_factor for both layer kinds (what the released checkpoint sets)."""
    params = hf.get("rope_parameters") or {}
    factors = {float((params.get(kind) or {}).get("partial_rotary_factor", PARTIAL_ROTARY_FACTOR)) for kind in THETAS}
    if len(factors) > 1:
        raise ConfigError(f"rope_parameters' partial_rotary_factor {sorted(factors)} is not supported: one factor "
                          "for the full and the sliding layers")
    return rotary_dim({"partial_rotary_factor": factors.pop()}, head_dim)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a MiMo-V2-Flash HF config (fields it leaves out or nulls take MiMoV2FlashConfig's defaults)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    if hf["attention_bias"]:
        raise ConfigError(f"attention_bias=True is not supported for {arch} (no released checkpoint has biases)")
    theta, scaling, local_theta = layer_type_rope({**hf, "rope_theta": None}, THETAS, "swa_rope_theta", arch)
    fields = {**common_fields({**hf, "rope_parameters": None}, arch), "rope_theta": theta, "rope_scaling": scaling}
    layers, kv_heads = fields["num_layers"], fields["num_kv_heads"]
    kinds, mlps = _layer_kinds(hf, layers)
    # transformers' note: `sliding_window_size` keys before the query, so the window (query included) is one more
    window = int(hf["sliding_window_size"]) + 1 if hf.get("sliding_window_size") is not None \
        else int(hf["sliding_window"])
    moe = moe_fields(hf, "n_routed_experts", int(hf["moe_intermediate_size"]), experts=256, per_token=8)
    groups, groups_per_token = int(hf["n_group"]), int(hf["topk_group"])
    check_groups(moe["num_experts"], groups, groups_per_token, moe["experts_per_token"])
    sliding = [kind == "sliding_attention" for kind in kinds]
    return ModelConfig(
        **fields,
        layer_kv_heads=tuple(2 * kv_heads if s else kv_heads for s in sliding),
        v_head_dim=int(hf["v_head_dim"]),
        value_scale=float(hf["attention_value_scale"]),
        rotary_dim=_rotary_dims(hf, fields["head_dim"]),
        local_rope_theta=local_theta,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=tuple(window if s else 0 for s in sliding),
        dense_layers=tuple(i for i, kind in enumerate(mlps) if kind == "dense"),
        norm_topk_prob=bool(hf["norm_topk_prob"]),
        expert_groups=groups,
        expert_groups_per_token=groups_per_token,
        routed_scaling_factor=float(hf["routed_scaling_factor"]),
        **moe,
    )


FAMILY = Family("mimo_v2_flash", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                layer_hf_leaves=layer_hf_leaves)
