"""Tencent HunYuan (HunYuanDenseV1ForCausalLM: Hunyuan-0.5B to 7B; HunYuanMoEV1ForCausalLM: Hunyuan-A13B).

The Llama layer with two changes in attention: per-head q/k RMSNorms (`query_layernorm`, `key_layernorm`) apply to
the rotated q and k (`cfg.qk_norm_after_rope`), and the rope type "dynamic" with an `alpha` is NTK-alpha scaling,
a fixed larger base: theta * alpha ** (head_dim / (head_dim - 2)) (transformers' HunYuanDenseV1RotaryEmbedding);
"dynamic" without an alpha rescales with the sequence's length and is refused. q/k/v/o biases by
`attention_bias`. The MoE model routes every layer: a float32 router (`mlp.gate.wg`), softmax over all experts,
the top `moe_topk` renormalised to sum to 1, plus an ungated shared MLP (`mlp.shared_mlp`) every token takes.
transformers sizes the experts and the shared MLP by `intermediate_size`; the released configs also carry vLLM's
per-layer lists (`moe_intermediate_size`, `moe_topk`, `num_experts`, `num_shared_expert`), read when every layer
has the same value (the shared MLP is num_shared_expert x intermediate_size wide, as vLLM builds it). Cross-layer
attention (`use_cla`), which transformers does not run, is refused by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.llama import abstract_layer as dense_leaves
from jaxinfer.models.llama import decoder_layer as dense_layer
from jaxinfer.models.llama import hf_leaves as dense_hf_leaves
from jaxinfer.models.moe import ROUTER_AXES, experts_hf_leaves, experts_output, is_dense, pre_norm_layer, route
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.shared_expert import (
    SharedExpertLayerWeights,
    abstract_shared_moe_layer,
    shared_expert,
    shared_expert_hf_leaves,
)
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

MOE = "HunYuanMoEV1ForCausalLM"
ARCHITECTURES = ("HunYuanDenseV1ForCausalLM", MOE)
# HunYuan's configs' defaults for fields a config leaves out (or nulls) where common_fields' differ.
HF_DEFAULTS = dict(rms_norm_eps=1e-5, max_position_embeddings=2048, num_experts=1, moe_topk=1, num_shared_expert=1,
                   use_mixed_mlp_moe=True, use_qk_norm=True, use_cla=False)


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> Any:
    """One layer's leaves: the Llama layer's, or routed experts (a float32 router) beside the ungated shared MLP."""
    if not cfg.num_experts:
        return dense_leaves(cfg, layer)
    moe = abstract_shared_moe_layer(cfg, gated=False)
    return dataclasses.replace(moe, router=ArrayInfo((cfg.hidden_size, cfg.num_experts), ROUTER_AXES,
                                                     dtype="float32"))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Llama's names with the q/k norms as `query_layernorm` / `key_layernorm`, and the MoE's under `mlp.`."""
    attn, mlp, K = "model.layers.{i}.self_attn.", "model.layers.{i}.mlp.", cfg.head_dim
    leaves = {
        **dense_hf_leaves(cfg),
        "q_norm": HFLeaf(attn + "query_layernorm.weight", "same", (K,)),
        "k_norm": HFLeaf(attn + "key_layernorm.weight", "same", (K,)),
    }
    if cfg.num_experts:
        leaves.update(router=HFLeaf(mlp + "gate.wg.weight", "transpose", (cfg.num_experts, cfg.hidden_size)),
                      **experts_hf_leaves(cfg, mlp + "experts.", ("gate_proj", "up_proj", "down_proj")),
                      **shared_expert_hf_leaves(cfg, mlp, "shared_mlp.", gated=False))
    return leaves


def moe_block(x: jax.Array, lw: SharedExpertLayerWeights, cfg: ModelConfig, layout: Layout) -> jax.Array:
    """The routed experts' output plus the shared MLP's for x [B, T, D], in x's dtype; float32 routing rows, as
    transformers routes them through its float32 `wg`."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    weights, experts = route(x2.astype(jnp.float32), lw.router, cfg.experts_per_token, renormalise=True)
    routed = experts_output(x2, weights, experts, lw, layout, cfg.activation).astype(x.dtype).reshape(shape)
    return routed + shared_expert(x, lw, cfg.activation)


def decoder_layer(cfg: ModelConfig, x, cache, lw, layer: int, positions, rope: RopeTables):
    """The Llama layer (HunYuan's attention options in cfg), its MLP routed experts in the MoE model."""
    if is_dense(lw):
        return dense_layer(cfg, x, cache, lw, layer, positions, rope)
    return pre_norm_layer(cfg, x, cache, lw, layer, positions, rope, lambda h, layout: moe_block(h, lw, cfg, layout))


def uniform(hf: Mapping[str, Any], key: str, num_layers: int) -> int:
    """A field that may list one value per layer (vLLM reads each layer's), read where every layer has the same."""
    value = hf[key]
    if not isinstance(value, (list, tuple)):
        return int(value)
    if len(value) != num_layers or len(set(value)) != 1:
        raise ConfigError(f"{key} {list(value)!r} is not supported: one value shared by all {num_layers} layers")
    return int(value[0])


def with_ntk_alpha(hf: Mapping[str, Any], arch: str, head_dim: int) -> dict[str, Any]:
    """The config with rope type "dynamic" + `alpha` read as the fixed base it is (NTK-alpha: rope_theta times
    alpha ** (head_dim / (head_dim - 2)), the default rope at it); other rope types pass as they are."""
    params = {**(hf.get("rope_parameters") or {}), **(hf.get("rope_scaling") or {})}
    if params.get("rope_type", params.get("type")) != "dynamic":
        return dict(hf)
    alpha = params.get("alpha")
    if not alpha:
        raise ConfigError(f"rope type 'dynamic' without an alpha is not supported for {arch}: it rescales with the "
                          "sequence's length; HunYuan's releases set alpha (a fixed NTK base)")
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rest = {key: value for key, value in hf.items() if key not in ("rope_parameters", "rope_scaling")}
    return {**rest, "rope_theta": theta * float(alpha) ** (head_dim / (head_dim - 2))}


def check_supported(hf: Mapping[str, Any], arch: str) -> None:
    """Refuse the settings transformers' HunYuan does not run, naming them."""
    if hf["use_cla"]:
        raise ConfigError(f"use_cla {hf['use_cla']!r} is not supported for {arch}: cross-layer attention (layers "
                          f"sharing K/V every cla_share_factor) is not run; false only")
    if not hf["use_qk_norm"]:
        raise ConfigError(f"use_qk_norm {hf['use_qk_norm']!r} is not supported for {arch}: true only (transformers "
                          "always applies query_layernorm / key_layernorm)")
    if arch == MOE and not hf["use_mixed_mlp_moe"]:
        raise ConfigError(f"use_mixed_mlp_moe {hf['use_mixed_mlp_moe']!r} is not supported for {arch}: true only "
                          "(every layer's shared MLP beside the experts, as transformers builds it)")


def moe_config(hf: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """The MoE model's routing fields: every layer's experts, top k (always renormalised) and shared MLP."""
    experts = uniform(hf, "num_experts", num_layers)
    if experts < 2:
        raise ConfigError(f"num_experts {experts} must be >= 2 for {MOE} (a dense HunYuan is HunYuanDenseV1)")
    intermediate = int(hf["intermediate_size"])
    width = uniform({**hf, "moe_intermediate_size": field(hf, "moe_intermediate_size", intermediate)},
                    "moe_intermediate_size", num_layers)
    return dict(num_experts=experts, experts_per_token=uniform(hf, "moe_topk", num_layers),
                moe_intermediate_size=width, norm_topk_prob=True,
                shared_expert_intermediate_size=uniform(hf, "num_shared_expert", num_layers) * intermediate)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a HunYuan dense or MoE HF config (transformers 4's and 5's layouts)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    check_supported(hf, arch)
    heads = int(hf["num_attention_heads"])
    head_dim = int(field(hf, "head_dim", field(hf, "attention_head_dim", int(hf["hidden_size"]) // heads)))
    fields = {**common_fields(with_ntk_alpha(hf, arch, head_dim), arch), "head_dim": head_dim}
    bias = bool(hf.get("attention_bias") or hf.get("bias"))
    return ModelConfig(
        **fields,
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        qk_norm_after_rope=True,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
        **(moe_config(hf, fields["num_layers"]) if arch == MOE else {}),
    )


FAMILY = Family("hunyuan", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
