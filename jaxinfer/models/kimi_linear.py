"""Kimi Linear (`KimiLinearForCausalLM`, Kimi-Linear-48B-A3B): Kimi Delta Attention layers (models/kimi_delta)
interleaved with DeepSeek-V3's latent attention without rotary embeddings, each followed by DeepSeek-V3's MoE.

Which layers are KDA: `layer_types` ("linear_attention" / "full_attention") where the config has it, else
`linear_attn_config`'s 1-indexed `kda_layers` / `full_attn_layers` (the hub's configs), else transformers' default
(every fourth layer from layer 4 attends). The attention layers are `models.deepseek`'s MLA with every layer in
`nope_layers` (transformers' KimiLinearAttention: the qk_rope_head_dim dims are cached and scored unturned) and a
plain qk_head_dim ** -0.5 scale; the MLP is dense on `mlp_layer_types`' "dense" layers (by default the first
`first_k_dense_replace`, 1) and elsewhere V3's noaux_tc routing (sigmoid scores, e_score_correction_bias to choose,
renormalised with `moe_renormalize`, times routed_scaling_factor) plus the shared experts, under the hub's names
(`block_sparse_moe.`, experts' w1 / w3 / w2). A KDA layer runs `hybrid.hybrid_layer` (its state kept per request
where attention keeps pages: cache/state_pool, prefix caching and speculative decoding refused, as for Qwen3-Next).

The config keys are Moonshot's (num_experts, num_experts_per_token, num_expert_group, num_shared_experts,
moe_renormalize, model_max_length: transformers' attribute_map), DeepSeek's names accepted too. Refused by name:
`mla_use_nope` false (rotary MLA: transformers runs NoPE whatever it says), a router other than sigmoid,
`moe_layer_freq` other than 1, MTP layers.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar, Collection, Mapping

import jax

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.models.deepseek import (
    DeepseekLayerWeights,
    DeepseekMoELayerWeights,
    grouped_fields,
    latent_fields,
    moe_mlp,
)
from jaxinfer.models.deepseek import abstract_layer as deepseek_abstract_layer
from jaxinfer.models.deepseek import decoder_layer as deepseek_decoder_layer
from jaxinfer.models.deepseek import hf_leaves as deepseek_hf_leaves
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.hybrid import hybrid_layer
from jaxinfer.models.kimi_delta import INPUT_PROJECTIONS, kda_hf_leaves, kda_leaves, kda_state
from jaxinfer.models.layers import Weight
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.mlp import gated_mlp, mlp_hf_leaves
from jaxinfer.models.moe import experts_hf_leaves
from jaxinfer.models.rope import RopeTables
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("KimiLinearForCausalLM",)
LAYER_TYPES = ("linear_attention", "full_attention")
MLP_LAYER_TYPES = ("dense", "sparse")
LATENT_FIELDS = ("wq", "wkv_a", "kv_a_norm", "w_uk", "w_uv", "wo", "wq_a", "q_a_norm")  # None on a KDA layer
MOE = "model.layers.{i}.block_sparse_moe."
# Moonshot's config keys -> DeepSeek-V3's (transformers' KimiLinearConfig.attribute_map, reversed).
KIMI_NAMES = {"num_experts": "n_routed_experts", "num_experts_per_token": "num_experts_per_tok",
              "num_expert_group": "n_group", "num_shared_experts": "n_shared_experts",
              "moe_renormalize": "norm_topk_prob", "model_max_length": "max_position_embeddings"}
# KimiLinearConfig's defaults (DeepSeek-V3's names) for the keys a config may leave out.
HF_DEFAULTS = dict(n_routed_experts=256, num_experts_per_tok=8, n_group=1, topk_group=1, n_shared_experts=1,
                   norm_topk_prob=True, routed_scaling_factor=2.446, moe_intermediate_size=1024, kv_lora_rank=512,
                   q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                   max_position_embeddings=1048576, rms_norm_eps=1e-5, linear_head_dim=128, linear_num_heads=32,
                   linear_conv_kernel_dim=4)
# transformers' save_pretrained writes a dense layer's MLP under the experts' module name; the hub keeps `mlp.`
SAVED_DENSE_MLP = re.compile(r"\.block_sparse_moe\.((?:gate|up|down)_proj\.weight)$")


@dataclasses.dataclass(kw_only=True)
class KdaFields:
    """Kimi Delta Attention's fields (see kimi_delta.kda_leaves) a KDA layer adds, its latent attention's None;
    None by default only because the parents' defaults come first."""

    in_q: Weight | None = None  # [D, H K]
    in_k: Weight | None = None  # [D, H K]
    in_v: Weight | None = None  # [D, H K]
    conv_q: jax.Array | None = None  # [H K, 1, conv kernel]
    conv_k: jax.Array | None = None
    conv_v: jax.Array | None = None
    f_a: Weight | None = None  # [D, K]
    f_b: Weight | None = None  # [K, H K]
    dt_bias: jax.Array | None = None  # [H K] float32
    a_log: jax.Array | None = None  # [1, 1, H, 1] float32
    in_b: Weight | None = None  # [D, H]
    g_a: Weight | None = None  # [D, K]
    g_b: Weight | None = None  # [K, H K]
    gate_norm: jax.Array | None = None  # [K]
    out_proj: Weight | None = None  # [H K, D]

    PROJECTIONS: ClassVar[dict[str, int]] = {name: 1 for name in ("in_q", "in_k", "in_v", "f_a", "f_b", "in_b",
                                                                   "g_a", "g_b", "out_proj")}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class KdaDenseLayer(KdaFields, DeepseekLayerWeights):
    """A KDA layer with the dense MLP."""

    PROJECTIONS: ClassVar[dict[str, int]] = {"w_gate": 1, "w_up": 1, "w_down": 1, **KdaFields.PROJECTIONS}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (INPUT_PROJECTIONS, ("w_gate", "w_up"))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class KdaMoELayer(KdaFields, DeepseekMoELayerWeights):
    """A KDA layer with routed and shared experts."""

    PROJECTIONS: ClassVar[dict[str, int]] = {"shared_gate": 1, "shared_up": 1, "shared_down": 1,
                                             **KdaFields.PROJECTIONS}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (INPUT_PROJECTIONS, ("shared_gate", "shared_up"))


def abstract_layer(cfg: ModelConfig, layer: int) -> Any:
    """Layer `layer`'s leaves: DeepSeek-V3's (the correction bias in its MoE layers), KDA's in place of latent
    attention on state layers."""
    base = deepseek_abstract_layer(cfg, layer, correction=True)
    if not cfg.is_state_layer(layer):
        return base
    kept = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.name not in LATENT_FIELDS}
    kind = KdaMoELayer if isinstance(base, DeepseekMoELayerWeights) else KdaDenseLayer
    return kind(**kept, **dict.fromkeys(LATENT_FIELDS), **kda_leaves(cfg.state_space, cfg.hidden_size))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """DeepSeek-V3's attention, norm and dense-MLP names, the experts under `block_sparse_moe.` (w1 gate, w3 up, w2
    down), and KDA's tensors under `self_attn.`."""
    D, E = cfg.hidden_size, cfg.num_experts
    shared = mlp_hf_leaves(D, cfg.shared_expert_intermediate_size, MOE + "shared_experts.")
    return {
        **deepseek_hf_leaves(cfg, correction=True),
        "router": HFLeaf(MOE + "gate.weight", "transpose", (E, D)),
        "score_correction": HFLeaf(MOE + "gate.e_score_correction_bias", "same", (E,)),
        **experts_hf_leaves(cfg, MOE + "experts.", ("w1", "w3", "w2")),
        "shared_gate": shared["w_gate"], "shared_up": shared["w_up"], "shared_down": shared["w_down"],
        **kda_hf_leaves(cfg.state_space, D, "model.layers.{i}.self_attn."),
    }


def stored_names(names: Collection[str]) -> dict[str, str]:
    """Tensor name -> the name stored, for a checkpoint transformers saved (a dense layer's MLP under
    `block_sparse_moe.`); empty for the hub's (`mlp.`), read as named."""
    if not any(SAVED_DENSE_MLP.search(name) for name in names):
        return {}
    return {SAVED_DENSE_MLP.sub(r".mlp.\1", name): name for name in names}


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """DeepSeek-V3's layer on an attention layer; on a KDA layer the hybrid layer over the same MLP."""
    if getattr(lw, "in_q", None) is None:
        return deepseek_decoder_layer(cfg, x, cache, lw, layer, positions, rope)

    def mlp(h: jax.Array, layout: Layout) -> jax.Array:
        if isinstance(lw, DeepseekMoELayerWeights):
            return moe_mlp(h, lw, cfg, layout)
        return gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation)

    return hybrid_layer(cfg, x, cache, lw, layer, positions, rope, mlp)


def _listed(hf: Mapping[str, Any], name: str, default: list[str], kinds: tuple[str, ...], layers: int) -> list[str]:
    """The config's per-layer list `name` (else `default`), checked against `kinds`."""
    types = field(hf, name, default)
    if len(types) != layers or not set(types) <= set(kinds):
        raise ConfigError(f"{name} {types!r} must list one of {list(kinds)} for each of the {layers} layers")
    return types


def layer_types(hf: Mapping[str, Any], layers: int) -> list[str]:
    """Each layer's mixer as transformers reads it: layer_types, else linear_attn_config's 1-indexed kda_layers /
    full_attn_layers, else attention on every fourth layer from layer 4."""
    linear = field(hf, "linear_attn_config", {})
    default = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(layers)]
    if "kda_layers" in linear and "full_attn_layers" in linear:
        default = [None] * layers
        for kind, listed in (("full_attention", "full_attn_layers"), ("linear_attention", "kda_layers")):
            for number in linear[listed]:
                if not 1 <= number <= layers:
                    raise ConfigError(f"linear_attn_config {listed} {linear[listed]!r} must number layers from 1 to "
                                      f"{layers}")
                default[number - 1] = kind
    return _listed(hf, "layer_types", default, LAYER_TYPES, layers)


def _check(hf: Mapping[str, Any], arch: str) -> None:
    """Refuse by name what transformers' KimiLinearForCausalLM does not run as the checkpoint means it."""
    refused = {"mla_use_nope": (True, "its latent attention runs without rotary embeddings"),
               "moe_router_activation_func": ("sigmoid", "its router scores by sigmoid"),
               "moe_layer_freq": (1, "experts in every layer past the dense ones"),
               "num_nextn_predict_layers": (0, "no multi-token-prediction layers"),
               "hidden_act": ("silu", "its KDA conv and MLPs run SiLU"), "attention_bias": (False, "no biases")}
    for name, (runs, why) in refused.items():
        if field(hf, name, runs) != runs:
            raise ConfigError(f"{name} {hf[name]!r} is not supported for {arch} ({why}); supported: {runs!r}")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Kimi Linear HF config (Moonshot's or DeepSeek's key names; KimiLinearConfig's defaults)."""
    _check(hf, arch)
    hf = {**HF_DEFAULTS, **{KIMI_NAMES.get(k, k): v for k, v in hf.items() if v is not None or k == "q_lora_rank"}}
    linear = field(hf, "linear_attn_config", {})
    fields = common_fields(hf, arch)
    layers = fields["num_layers"]
    types = layer_types(hf, layers)
    first_k = int(field(hf, "first_k_dense_replace", 1))
    mlp_types = _listed(hf, "mlp_layer_types", ["dense" if i < first_k else "sparse" for i in range(layers)],
                        MLP_LAYER_TYPES, layers)
    state = kda_state(tuple(i for i, t in enumerate(types) if t == "linear_attention"),
                      heads=int(linear.get("num_heads", hf["linear_num_heads"])),
                      head_dim=int(linear.get("head_dim", hf["linear_head_dim"])),
                      conv_kernel=int(linear.get("short_conv_kernel_size", hf["linear_conv_kernel_dim"])),
                      eps=fields["rms_norm_eps"])
    moe = moe_fields(hf, "n_routed_experts", int(hf["moe_intermediate_size"]))
    latent = latent_fields(hf, fields, interleaved=False)
    return ModelConfig(
        **{**latent, "attn_scale": latent["latent_attention"].qk_head_dim ** -0.5},
        activation=activation_name("silu"),
        nope_layers=tuple(range(layers)),
        dense_layers=tuple(i for i, t in enumerate(mlp_types) if t == "dense"),
        state_space=state,
        **grouped_fields(hf, arch, moe),
        **moe,
    )


FAMILY = Family("kimi_linear", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                stored_names=stored_names)
