"""HY-V4 (HYV4ForCausalLM, Tencent's Hy4): GLM-4.7-Flash's MoE layers over DSA attention, with hyper-connections.

- Four residual streams a token (`models.hyper_connections`, iHC: no mixing between streams): the first layer
  expands the embeddings into them; around attention and the MLP a learned read gate collapses them into the
  sublayer's input and a write gate (hc_magnitude * sigmoid + hc_eps) adds its output to each; the last layer's
  head gate collapses them before the final norm.
- Attention (`models.hy_v4_attention`): DeepSeek-V3.2's sparse latent attention with sinks, an output gate and
  "shared" layers reusing the last full layer's choice of tokens; the choice rides with the streams.
- MLP: dense in the `mlp_layer_types` "dense" layers, else GLM-4.7-Flash's (sigmoid scores, correction bias for
  choosing, renormalised, times routed_scaling_factor; ungated shared experts) with each routed expert's gate and up
  clamped at swiglu_limit (`mlp.ClampedSiLU`).

transformers keeps the gates, sinks, router and lm_head float32; here the gates, sinks and router are float32
leaves, the head the model's dtype (its logits float32). Its MTP layers (`model.mtp_layers.*`) are not read.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Collection, Mapping

import jax

from jaxinfer.config.hyper_connections import HyperConnections
from jaxinfer.config.latent_attention import LightningIndexer
from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.deepseek import (
    DeepseekLayerWeights,
    DeepseekMoELayerWeights,
    grouped_fields,
    latent_fields,
    moe_mlp,
)
from jaxinfer.models.deepseek import abstract_layer as v3_layer
from jaxinfer.models.deepseek import hf_leaves as v3_hf_leaves
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.glm4_moe_lite import dense_layers
from jaxinfer.models.hy_v4_attention import (
    GatedSinks,
    gated_sinks_hf_leaves,
    gated_sinks_leaves,
    gated_sparse_attention,
)
from jaxinfer.models.hyper_connections import (
    STREAMS,
    HyperConnectionLayer,
    around,
    collapse_head,
    expand,
    gate_width,
    hyper_connection_leaves,
)
from jaxinfer.models.lightning_indexer import indexer_hf_leaves, indexer_leaves
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.mlp import ClampedSiLU, gated_mlp
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables

ARCHITECTURES = ("HYV4ForCausalLM",)
# HYV4Config's defaults for the fields a config may leave out (or null).
HF_DEFAULTS = dict(moe_intermediate_size=768, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
                   routed_scaling_factor=2.827, norm_topk_prob=True, n_group=1, topk_group=1, q_lora_rank=1536,
                   kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256, rms_norm_eps=1e-5,
                   max_position_embeddings=262144, index_topk=2048, index_head_dim=128, index_n_heads=16, hc_mult=4,
                   hc_magnitude=2.0, hc_eps=1e-6, swiglu_limit=10.0)
INDEXER_TYPES = ("full", "shared")
# transformers saves the dense and shared MLPs' gate_proj as linear_gate (its rename of the attention's output gate
# runs backwards on every `.gate_proj`); the released names are read as they are.
SAVED_MLP_GATE = ("mlp.linear_gate.", "mlp.gate_proj."), ("shared_experts.linear_gate.", "shared_experts.gate_proj.")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class HyV4LayerWeights(DeepseekLayerWeights, GatedSinks, HyperConnectionLayer):
    """A dense layer; the indexer's fields None on a shared layer."""

    index_wq: jax.Array | None = None  # see lightning_indexer.IndexerWeights
    index_wk: jax.Array | None = None
    index_k_norm: jax.Array | None = None
    index_k_bias: jax.Array | None = None
    index_weights: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class HyV4MoELayerWeights(DeepseekMoELayerWeights, GatedSinks, HyperConnectionLayer):
    """An MoE layer; the indexer's fields None on a shared layer."""

    index_wq: jax.Array | None = None
    index_wk: jax.Array | None = None
    index_k_norm: jax.Array | None = None
    index_k_bias: jax.Array | None = None
    index_weights: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Streams:
    """What one layer hands the next: the residual streams and the last full layer's choice of positions."""

    streams: jax.Array  # [B, T, N, D]
    chosen: jax.Array  # [B, T, k] int32


def abstract_layer(cfg: ModelConfig, layer: int) -> Any:
    """GLM-4.7-Flash's layer leaves (experts fused as HY-V4 stores them), the gate and sinks, the indexer's on a
    full layer, the hyper-connections' (the head's on the last layer)."""
    v3 = v3_layer(cfg, layer, correction=True)
    kind = HyV4MoELayerWeights if isinstance(v3, DeepseekMoELayerWeights) else HyV4LayerWeights
    fields = {f.name: getattr(v3, f.name) for f in dataclasses.fields(v3)}
    indexer = {} if layer in cfg.latent_attention.indexer.shared_layers else indexer_leaves(cfg)
    return kind(**fields, **indexer, **gated_sinks_leaves(cfg), **hyper_connection_leaves(cfg, layer))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each field lives in a checkpoint as HY-V4 ships it (transformers' save writes the same names)."""
    D, E, F, hc = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, cfg.hyper_connections
    flat, width, experts = hc.mult * D, gate_width(hc), "model.layers.{i}.mlp.experts."
    gates = {}
    for sub, hf in (("attn", "attn"), ("mlp", "mlp")):
        prefix = f"model.layers.{{i}}.hc_pre.hc_{hf}_layer.hc_"
        gates[f"{sub}_hc_fn"] = HFLeaf(prefix + "fn", "transpose", (width, flat))
        gates[f"{sub}_hc_base"] = HFLeaf(prefix + "base", "same", (width,))
        gates[f"{sub}_hc_scale"] = HFLeaf(prefix + "scale", "same", (2,))
    head = "model.hc_pre.hc_head.hc_head_"
    return {
        **v3_hf_leaves(cfg, correction=True),
        **indexer_hf_leaves(cfg),
        **gated_sinks_hf_leaves(cfg),
        "moe_gate": HFLeaf(experts + "gate_up_proj", "transpose", (E, 2 * F, D)),
        "moe_up": HFLeaf(experts + "gate_up_proj", "transpose", (E, 2 * F, D), row_offset=F),
        "moe_down": HFLeaf(experts + "down_proj", "transpose", (E, D, F)),
        **gates,
        "head_hc_fn": HFLeaf(head + "fn", "transpose", (hc.mult, flat)),
        "head_hc_base": HFLeaf(head + "base", "same", (hc.mult,)),
        "head_hc_scale": HFLeaf(head + "scale", "same", (1,)),
    }


def stored_names(names: Collection[str]) -> dict[str, str]:
    """Tensor name -> the name stored, for a checkpoint transformers saved (the MLPs' gate_proj as linear_gate);
    empty for one with the released names, read as named."""
    if not any(saved in name for name in names for saved, _ in SAVED_MLP_GATE):
        return {}
    renamed = {}
    for name in names:
        released = name
        for saved, own in SAVED_MLP_GATE:
            released = released.replace(saved, own)
        renamed[released] = name
    return renamed


def decoder_layer(
    cfg: ModelConfig, x: jax.Array | Streams, cache: Any, lw: Any, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array | Streams, Any]:
    """One layer over the streams (the first expands the embeddings [B, T, D] into them; the last collapses them:
    [B, T, D] for the final norm): gated DSA attention, then the dense MLP or the clamped experts."""
    layout, hc, eps = cache.layout, cfg.hyper_connections, cfg.rms_norm_eps
    streams, chosen = (layout.constrain(expand(x, hc), STREAMS), None) if isinstance(x, jax.Array) else (
        x.streams, x.chosen)
    attended = {}

    def attention(h: jax.Array) -> jax.Array:
        nonlocal cache
        out, cache, attended["chosen"] = gated_sparse_attention(cfg, rms_norm(h, lw.attn_norm, eps), cache, lw, layer,
                                                                positions, rope.for_layer(layer), chosen)
        return out

    def mlp(h: jax.Array) -> jax.Array:
        h = rms_norm(h, lw.mlp_norm, eps)
        if isinstance(lw, DeepseekMoELayerWeights):
            return moe_mlp(h, lw, cfg, layout, expert_gate=ClampedSiLU(cfg.swiglu_limit))
        return gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation)

    streams = layout.constrain(around(streams, lw.attn_hc_fn, lw.attn_hc_base, lw.attn_hc_scale, hc, attention),
                               STREAMS)
    streams = layout.constrain(around(streams, lw.mlp_hc_fn, lw.mlp_hc_base, lw.mlp_hc_scale, hc, mlp), STREAMS)
    if lw.head_hc_fn is not None:
        return collapse_head(streams, lw, hc), cache
    return Streams(streams, attended["chosen"]), cache


def _layer_kinds(hf: Mapping[str, Any], arch: str, num_layers: int) -> tuple[int, ...]:
    """The shared layers (`indexer_types` "shared"; transformers' default: all but layer 0 and every fourth from
    layer 1), every layer indexed attention."""
    layer_types = field(hf, "layer_types", ["indexed_attention"] * num_layers)
    if list(layer_types) != ["indexed_attention"] * num_layers:
        raise ConfigError(f"layer_types {layer_types!r} is not supported for {arch}: every layer is "
                          "'indexed_attention'")
    default = ["full" if i == 0 or (i - 1) % 4 == 0 else "shared" for i in range(num_layers)]
    kinds = list(field(hf, "indexer_types", default))
    if len(kinds) != num_layers or set(kinds) - set(INDEXER_TYPES) or kinds[0] != "full":
        raise ConfigError(f"indexer_types {kinds!r} must give one of {list(INDEXER_TYPES)} for each of the "
                          f"{num_layers} layers, the first 'full' (a shared layer reuses an earlier full layer's)")
    return tuple(i for i, kind in enumerate(kinds) if kind == "shared")


def _hyper_connections(hf: Mapping[str, Any], arch: str) -> HyperConnections:
    """HY-V4's iHC: hc_mult streams, its gates' constants, no mixing between the streams."""
    mult, limit = int(hf["hc_mult"]), float(hf["swiglu_limit"])
    if mult < 1 or limit <= 0:
        raise ConfigError(f"hc_mult {mult} / swiglu_limit {limit} not supported for {arch}: hc_mult >= 1 and "
                          "swiglu_limit > 0 (transformers clamps at it whatever its sign)")
    return HyperConnections(mult=mult, eps=float(hf["hc_eps"]), norm_eps=float(hf["rms_norm_eps"]),
                            post_scale=float(hf["hc_magnitude"]))


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an HY-V4 HF config (fields it leaves out or nulls take HYV4Config's defaults)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    fields = common_fields(hf, arch)
    shared = _layer_kinds(hf, arch, fields["num_layers"])
    moe = moe_fields(hf, "n_routed_experts", int(hf["moe_intermediate_size"]))
    cfg = ModelConfig(
        **latent_fields(hf, fields, interleaved=False),
        activation=activation_name(hf.get("hidden_act") or "silu"),
        # layer_types names the indexed layers (checked above), not windows
        layer_windows=uniform_windows({**hf, "layer_types": None}, arch, fields["num_layers"], 0),
        dense_layers=dense_layers(hf, fields["num_layers"]),
        swiglu_limit=float(hf["swiglu_limit"]),
        hyper_connections=_hyper_connections(hf, arch),
        **grouped_fields(hf, arch, moe),
        **moe,
    )
    indexer = LightningIndexer(
        index_topk=int(hf["index_topk"]), index_head_dim=int(hf["index_head_dim"]),
        index_n_heads=int(hf["index_n_heads"]), rope_interleaved=False, rope_last=True,
        key_norm_eps=cfg.rms_norm_eps, shared_layers=shared,
    )
    if indexer.index_head_dim < cfg.rotary_dim or indexer.index_topk < 1:
        raise ConfigError(f"index_head_dim {indexer.index_head_dim} / index_topk {indexer.index_topk} not supported "
                          f"for {arch}: index_head_dim >= qk_rope_head_dim ({cfg.rotary_dim}), index_topk >= 1")
    mla = dataclasses.replace(cfg.latent_attention, indexer=indexer)
    return dataclasses.replace(cfg, latent_attention=mla, head_dim=mla.cached_dims)


FAMILY = Family("hy_v4", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                stored_names=stored_names)
