"""SK Telecom A.X-K1 (AXK1ForCausalLM): DeepSeek-V3's model with the MoE block's output RMS-normed.

transformers builds it from DeepSeek-V3's modules (latent attention with a low-rank query, always: `q_lora_rank`
may not be null; rope on the `qk_rope_head_dim` dims in adjacent pairs unless `rope_interleave` is false;
noaux_tc routing: sigmoid scores, `e_score_correction_bias` for choosing only, `topk_group` of `n_group` groups,
renormalised, times `routed_scaling_factor`; ungated shared experts) with one change: each MoE layer's output
(routed plus shared experts) passes through an RMSNorm (`post_mlp_layernorm`, stored at the layer's level) before
the residual add. Each layer's MLP is dense or sparse by `mlp_layer_types`, by default from the legacy
`first_k_dense_replace` (1) and `moe_layer_freq` (1): sparse where i >= first_k_dense_replace and
i % moe_layer_freq == 0, as AXK1Config derives it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.deepseek import (
    KEPT_NULL,
    DeepseekMoELayerWeights,
    Router,
    grouped_fields,
    latent_fields,
    moe_mlp,
)
from jaxinfer.models.deepseek import abstract_layer as deepseek_layer
from jaxinfer.models.deepseek import decoder_layer as deepseek_decoder_layer
from jaxinfer.models.deepseek import hf_leaves as deepseek_leaves
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.glm4_moe_lite import ROUTING
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("AXK1ForCausalLM",)
# AXK1Config's defaults for the fields a config may leave out (or null); DeepseekV3Config's where it keeps them.
HF_DEFAULTS = dict(moe_intermediate_size=2048, n_shared_experts=1, n_routed_experts=192, routed_scaling_factor=2.5,
                   kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
                   n_group=8, topk_group=4, num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=32768,
                   rms_norm_eps=1e-6, bos_token_id=163691, eos_token_id=163691, rope_interleave=True,
                   first_k_dense_replace=1, moe_layer_freq=1)
MLP_LAYER_TYPES = ("dense", "sparse")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class AXK1MoELayerWeights(DeepseekMoELayerWeights):
    """DeepSeek-V3's MoE layer and the norm of its MLP output."""

    post_mlp_norm: jax.Array  # [D]


def abstract_layer(cfg: ModelConfig, layer: int) -> Any:
    """DeepSeek-V3's layer leaves (the MoE layers with the correction bias and the post-MLP norm)."""
    base = deepseek_layer(cfg, layer, correction=True)
    if not isinstance(base, DeepseekMoELayerWeights):
        return base
    return AXK1MoELayerWeights(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                               post_mlp_norm=ArrayInfo((cfg.hidden_size,), ("embed",), init_value=1.0))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """DeepSeek-V3's names, the correction bias and `post_mlp_layernorm` (read in the MoE layers only)."""
    norm = HFLeaf("model.layers.{i}.post_mlp_layernorm.weight", "same", (cfg.hidden_size,))
    return {**deepseek_leaves(cfg, correction=True), "post_mlp_norm": norm}


def normed_moe(h: jax.Array, lw: AXK1MoELayerWeights, cfg: ModelConfig, layout: Layout, router: Router) -> jax.Array:
    """DeepSeek-V3's routed plus shared experts' output, RMS-normed."""
    return rms_norm(moe_mlp(h, lw, cfg, layout, router), lw.post_mlp_norm, cfg.rms_norm_eps)


def decoder_layer(cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array,
                  rope: RopeTables) -> tuple[jax.Array, Any]:
    """DeepSeek-V3's layer, its MoE output normed."""
    return deepseek_decoder_layer(cfg, x, cache, lw, layer, positions, rope, moe=normed_moe)


def dense_layers(hf: Mapping[str, Any], arch: str, num_layers: int) -> tuple[int, ...]:
    """The dense-MLP layers: "dense" in mlp_layer_types, else as AXK1Config derives them from first_k_dense_replace
    and moe_layer_freq."""
    first, freq = int(hf["first_k_dense_replace"]), int(hf["moe_layer_freq"])
    if freq < 1:
        raise ConfigError(f"moe_layer_freq {freq} must be >= 1 for {arch} (every freq-th layer has experts)")
    default = ["sparse" if i >= first and i % freq == 0 else "dense" for i in range(num_layers)]
    types = field(hf, "mlp_layer_types", default)
    if len(types) != num_layers or any(kind not in MLP_LAYER_TYPES for kind in types):
        raise ConfigError(f"mlp_layer_types {types!r} must give one of {list(MLP_LAYER_TYPES)} for each of the "
                          f"{num_layers} layers of {arch}")
    return tuple(i for i, kind in enumerate(types) if kind == "dense")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an A.X-K1 HF config (AXK1Config's defaults where a key is absent or null)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None or key in KEPT_NULL}}
    if not hf["q_lora_rank"]:
        raise ConfigError(f"q_lora_rank {hf['q_lora_rank']!r} is not supported for {arch}: its attention always "
                          "has the low-rank query (q_a_proj, q_b_proj)")
    for name, runs in ROUTING.items():
        if field(hf, name, runs) != runs:
            raise ConfigError(f"{name} {hf[name]!r} is not supported for {arch}: it routes by {runs!r} only")
    fields = common_fields(hf, arch)
    moe = moe_fields(hf, "n_routed_experts", int(hf["moe_intermediate_size"]))
    return ModelConfig(
        **latent_fields(hf, fields, bool(hf["rope_interleave"])),
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
        dense_layers=dense_layers(hf, arch, fields["num_layers"]),
        **grouped_fields(hf, arch, moe),
        **moe,
    )


FAMILY = Family("axk1", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
