"""DeepSeek-V2 and DeepSeek-V3 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM): latent attention, then routed experts.

DeepSeek-V2(-Lite), DeepSeek-Coder-V2(-Lite), DeepSeek-V3/R1, Moonlight and Kimi-K2 are these two architectures as
transformers 5 defines them. Attention is multi-head latent attention with a compressed cache
(`models.latent_attention`). The first `first_k_dense_replace` layers have a dense MLP of `intermediate_size`;
every later one routes each token to `num_experts_per_tok` of `n_routed_experts` experts and adds ungated shared
experts (one MLP of n_shared_experts x moe_intermediate_size). The router and V3's correction bias stay float32,
as transformers keeps them, and route float32 rows:

- V2: softmax scores, the top k (`topk_method` greedy) or the top k within the best `topk_group` of `n_group`
  groups (group_limited_greedy; `models.limited_greedy`), times routed_scaling_factor, never renormalised;
  rotary embeddings in adjacent pairs (transformers' complex form).
- V3: "noaux_tc" (`models.grouped_topk`: sigmoid scores, e_score_correction_bias to choose, groups ranked by their
  two best, renormalised with norm_topk_prob, times routed_scaling_factor); rotary pairs adjacent with
  `rope_interleave` (the default), rotate-half without.

Multi-token-prediction layers stored after the decoder's (`num_nextn_predict_layers`) are skipped by the decoder;
V3's first drafts for speculative decoding (`speculative.mtp`, method "mtp").

GLM-4.7-Flash (`models.glm4_moe_lite`) and Mistral 4 (`models.mistral4`) run this layer: the first with V3's
routing (`correction`), the second with its own router (`router`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.latent_attention import LatentAttention
from jaxinfer.config.model import (
    ConfigError,
    ModelConfig,
    RopeScaling,
    activation_name,
    common_fields,
    field,
    uniform_windows,
)
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.grouped_matmul import Experts
from jaxinfer.models.grouped_topk import check_groups, grouped_topk
from jaxinfer.models.latent_attention import (
    LatentAttentionLayer,
    latent_attention,
    latent_attention_hf_leaves,
    latent_attention_leaves,
)
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.limited_greedy import check_limited_groups, limited_greedy
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.mlp import Gate, gated_mlp, mlp_hf_leaves, mlp_leaves
from jaxinfer.models.moe import DOWN_AXES, GATE_AXES, ROUTER_AXES, experts_hf_leaves, experts_output
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables, yarn_mscale
from jaxinfer.models.self_attention import HIDDEN
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

V2, V3 = "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"
ARCHITECTURES = (V2, V3)
_BOTH = dict(kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
             max_position_embeddings=4096)
# transformers' DeepseekV2Config / DeepseekV3Config defaults for the fields a config may leave out, and the routing
# each runs under the names DeepSeek's own configs give it (topk_method, scoring_func).
HF_DEFAULTS = {
    V2: {**_BOTH, "max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2, "n_routed_experts": 64,
         "n_shared_experts": 2, "moe_intermediate_size": 1407, "first_k_dense_replace": 0,
         "routed_scaling_factor": 1.0, "topk_method": "greedy", "scoring_func": "softmax", "norm_topk_prob": False},
    V3: {**_BOTH, "bos_token_id": 0, "eos_token_id": 1, "n_routed_experts": 256, "n_shared_experts": 1,
         "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "routed_scaling_factor": 2.5, "n_group": 8,
         "topk_group": 4, "num_experts_per_tok": 8, "norm_topk_prob": True, "rope_interleave": True,
         "topk_method": "noaux_tc", "scoring_func": "sigmoid"},
}
KEPT_NULL = ("q_lora_rank", "bos_token_id", "eos_token_id")  # null means none here, as transformers reads them
V2_TOPK_METHODS = ("greedy", "group_limited_greedy")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class DeepseekLayerWeights(LatentAttentionLayer):
    """A dense layer (the first first_k_dense_replace): latent attention, then a gated MLP."""

    w_gate: Weight  # [D, F]
    w_up: Weight  # [D, F]
    w_down: Weight  # [F, D]

    PROJECTIONS: ClassVar[dict[str, int]] = {**LatentAttentionLayer.PROJECTIONS, "w_gate": 1, "w_up": 1, "w_down": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (*LatentAttentionLayer.JOINED, ("w_gate", "w_up"))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class DeepseekMoELayerWeights(LatentAttentionLayer):
    """An MoE layer: latent attention, then routed experts plus ungated shared experts."""

    router: jax.Array  # [D, E] float32
    moe_gate: Experts  # [E, D, F]
    moe_up: Experts  # [E, D, F]
    moe_down: Experts  # [E, F, D]
    shared_gate: Weight  # [D, S]
    shared_up: Weight  # [D, S]
    shared_down: Weight  # [S, D]
    score_correction: jax.Array | None = None  # [E] float32: V3's e_score_correction_bias, added for choosing only

    PROJECTIONS: ClassVar[dict[str, int]] = {**LatentAttentionLayer.PROJECTIONS, "shared_gate": 1, "shared_up": 1,
                                             "shared_down": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (*LatentAttentionLayer.JOINED, ("shared_gate", "shared_up"))
    EXPERTS: ClassVar[tuple[str, ...]] = ("moe_gate", "moe_up", "moe_down")


def _corrected(cfg: ModelConfig, correction: bool | None) -> bool:
    """Whether the MoE layers hold e_score_correction_bias: `correction`, or where None V3's do."""
    return cfg.architecture == V3 if correction is None else correction


def abstract_layer(cfg: ModelConfig, layer: int, correction: bool | None = None) -> Any:
    """One layer's leaves as ArrayInfos: a dense MLP in `dense_layers`, routed and shared experts elsewhere
    (`correction`: the MoE layers hold e_score_correction_bias; None: V3's do)."""
    D, E, F = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    attention = latent_attention_leaves(cfg)
    if not cfg.is_moe_layer(layer):
        return DeepseekLayerWeights(**attention, **mlp_leaves(D, cfg.intermediate_size))
    shared = mlp_leaves(D, cfg.shared_expert_intermediate_size)
    bias = ArrayInfo((E,), (None,), init_value=0.0, dtype="float32") if _corrected(cfg, correction) else None
    return DeepseekMoELayerWeights(
        **attention,
        router=ArrayInfo((D, E), ROUTER_AXES, dtype="float32"),
        moe_gate=ArrayInfo((E, D, F), GATE_AXES),
        moe_up=ArrayInfo((E, D, F), GATE_AXES),
        moe_down=ArrayInfo((E, F, D), DOWN_AXES),
        shared_gate=shared["w_gate"], shared_up=shared["w_up"], shared_down=shared["w_down"],
        score_correction=bias,
    )


def hf_leaves(cfg: ModelConfig, correction: bool | None = None) -> dict[str, HFLeaf]:
    """Where each layer field lives (the dense MLP's fields only in dense layers, the experts' in the others;
    `correction` as abstract_layer's)."""
    D, E, mlp = cfg.hidden_size, cfg.num_experts, "model.layers.{i}.mlp."
    shared = mlp_hf_leaves(D, cfg.shared_expert_intermediate_size, mlp + "shared_experts.")
    leaves = {
        "attn_norm": HFLeaf("model.layers.{i}.input_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf("model.layers.{i}.post_attention_layernorm.weight", "same", (D,)),
        **latent_attention_hf_leaves(cfg),
        **mlp_hf_leaves(D, cfg.intermediate_size),
        "router": HFLeaf(mlp + "gate.weight", "transpose", (E, D)),
        **experts_hf_leaves(cfg, mlp + "experts.", ("gate_proj", "up_proj", "down_proj")),
        "shared_gate": shared["w_gate"], "shared_up": shared["w_up"], "shared_down": shared["w_down"],
    }
    if _corrected(cfg, correction):
        leaves["score_correction"] = HFLeaf(mlp + "gate.e_score_correction_bias", "same", (E,))
    return leaves


# (router logits [N, E] float32, the layer, cfg) -> routing weights [N, k] float32 and expert ids [N, k]
Router = Callable[[jax.Array, DeepseekMoELayerWeights, ModelConfig], tuple[jax.Array, jax.Array]]


def route(logits: jax.Array, lw: DeepseekMoELayerWeights, cfg: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """V3's noaux_tc where the layer holds a correction bias, V2's softmax top k otherwise."""
    choice = (cfg.experts_per_token, cfg.expert_groups, cfg.expert_groups_per_token)
    if lw.score_correction is not None:
        return grouped_topk(logits, lw.score_correction, *choice, cfg.norm_topk_prob, cfg.routed_scaling_factor)
    return limited_greedy(logits, *choice, cfg.routed_scaling_factor)


def moe_mlp(h: jax.Array, lw: DeepseekMoELayerWeights, cfg: ModelConfig, layout: Layout, router: Router = route,
            expert_gate: Gate | None = None) -> jax.Array:
    """The routed experts' output plus the shared experts' for the normed h [B, T, D], in h's dtype (the routed
    experts gated by `expert_gate`, HY-V4's clamped SiLU; None: cfg.activation as the shared ones)."""
    x2 = h.reshape(-1, h.shape[-1])
    logits = linear(x2.astype(jnp.float32), lw.router)  # float32 rows and router, as transformers computes them
    weights, experts = router(logits, lw, cfg)
    routed = experts_output(x2, weights, experts, lw, layout, expert_gate or cfg.activation)
    routed = routed.astype(h.dtype).reshape(h.shape)
    return routed + gated_mlp(h, lw.shared_gate, lw.shared_up, lw.shared_down, cfg.activation)


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: RopeTables,
    router: Router = route, attention: Callable = latent_attention, moe: Callable = moe_mlp,
) -> tuple[jax.Array, Any]:
    """One pre-norm block: latent attention over the cache (`attention`: DeepSeek-V3.2's sparse one), then the
    dense MLP or the experts (routed by `router`; `moe`: A.X-K1's, normed after)."""
    layout = cache.layout
    h = rms_norm(x, lw.attn_norm, cfg.rms_norm_eps)
    out, cache = attention(cfg, h, cache, lw, layer, positions, rope.for_layer(layer))
    x = layout.constrain(x + out, HIDDEN)
    h = rms_norm(x, lw.mlp_norm, cfg.rms_norm_eps)
    if isinstance(lw, DeepseekMoELayerWeights):
        mlp = moe(h, lw, cfg, layout, router)
    else:
        mlp = gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation)
    return layout.constrain(x + mlp, HIDDEN), cache


def softmax_scale(qk_head_dim: int, scaling: RopeScaling) -> float:
    """transformers' attention scale: qk_head_dim ** -0.5, times YaRN's mscale(factor, mscale_all_dim) squared
    where the rope is scaled (any type but default) and mscale_all_dim is set."""
    scale = qk_head_dim**-0.5
    if scaling.rope_type != "default" and scaling.mscale_all_dim:
        scale *= yarn_mscale(scaling.factor, scaling.mscale_all_dim) ** 2
    return scale


def _latent_dims(hf: Mapping[str, Any]) -> LatentAttention:
    """MLA's dims; a null q_lora_rank means no low-rank query (V2-Lite, Moonlight), as in transformers."""
    dims = {name: int(hf[name]) for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    return LatentAttention(**dims, q_lora_rank=int(hf["q_lora_rank"] or 0))


def _check_routing(hf: Mapping[str, Any], arch: str) -> None:
    """Refuse routing settings this architecture does not run as the checkpoint's own code would."""
    method, scoring = field(hf, "topk_method"), field(hf, "scoring_func")
    runs = V2_TOPK_METHODS if arch == V2 else (HF_DEFAULTS[V3]["topk_method"],)
    if method not in runs or scoring != HF_DEFAULTS[arch]["scoring_func"]:
        raise ConfigError(f"topk_method {method!r} with scoring_func {scoring!r} is not supported for {arch}; it "
                          f"routes by topk_method {' or '.join(runs)} with {HF_DEFAULTS[arch]['scoring_func']} scores")
    if int(field(hf, "moe_layer_freq", 1)) != 1:
        raise ConfigError(f"moe_layer_freq {hf['moe_layer_freq']} is not supported: {arch} has experts in every layer "
                          "from first_k_dense_replace on (moe_layer_freq 1)")
    if arch == V2 and hf.get("norm_topk_prob"):
        raise ConfigError(f"norm_topk_prob=True is not supported for {arch}: transformers' router never renormalises "
                          "(no released DeepSeek-V2 sets it)")


def latent_fields(hf: Mapping[str, Any], fields: Mapping[str, Any], interleaved: bool) -> dict[str, Any]:
    """common_fields' `fields` with MLA's: one cached row per token (num_kv_heads 1, head_dim kv_lora_rank +
    qk_rope_head_dim), rope on the qk_rope_head_dim dims (adjacent pairs where `interleaved`), transformers'
    softmax scale."""
    if hf.get("attention_bias"):
        raise ConfigError(f"attention_bias=True is not supported for {fields['architecture']} (no released "
                          "checkpoint uses it)")
    mla = _latent_dims(hf)
    return dict(
        **{**fields, "num_kv_heads": 1, "head_dim": mla.cached_dims},
        latent_attention=mla,
        rotary_dim=mla.qk_rope_head_dim,
        rope_interleaved=interleaved,
        attn_scale=softmax_scale(mla.qk_head_dim, fields["rope_scaling"]),
    )


def shared_experts_size(hf: Mapping[str, Any], arch: str, moe: Mapping[str, Any]) -> int:
    """The shared experts' hidden units (n_shared_experts x moe_intermediate_size), at least one expert's."""
    shared = int(hf["n_shared_experts"])
    if shared < 1:
        raise ConfigError(f"n_shared_experts {shared} must be >= 1 (every released {arch} has shared experts)")
    return shared * moe["moe_intermediate_size"]


def grouped_fields(hf: Mapping[str, Any], arch: str, moe: Mapping[str, Any]) -> dict[str, Any]:
    """V3's routing fields beyond moe_fields' (GLM-4.7-Flash's and Mistral 4's too): shared experts, n_group /
    topk_group checked, routed_scaling_factor, norm_topk_prob."""
    groups, groups_per_token = int(hf["n_group"]), int(hf["topk_group"])
    check_groups(moe["num_experts"], groups, groups_per_token, moe["experts_per_token"])
    return dict(
        shared_expert_intermediate_size=shared_experts_size(hf, arch, moe),
        expert_groups=groups,
        expert_groups_per_token=groups_per_token,
        routed_scaling_factor=float(hf["routed_scaling_factor"]),
        norm_topk_prob=bool(hf["norm_topk_prob"]),
    )


def _routing_fields(hf: Mapping[str, Any], arch: str, moe: Mapping[str, Any]) -> dict[str, Any]:
    """The MoE fields beyond moe_fields': shared experts, groups, scaling, renormalising."""
    if arch == V3:
        return grouped_fields(hf, arch, moe)
    experts, k = moe["num_experts"], moe["experts_per_token"]
    groups, groups_per_token = 1, 1
    if hf["topk_method"] == "group_limited_greedy":
        if field(hf, "n_group") is None or field(hf, "topk_group") is None:
            raise ConfigError(f"topk_method group_limited_greedy needs n_group and topk_group (got {hf.get('n_group')}"
                              f", {hf.get('topk_group')})")
        groups, groups_per_token = int(hf["n_group"]), int(hf["topk_group"])
        check_limited_groups(experts, groups, groups_per_token, k)
    return dict(
        shared_expert_intermediate_size=shared_experts_size(hf, arch, moe),
        expert_groups=groups,
        expert_groups_per_token=groups_per_token,
        routed_scaling_factor=float(hf["routed_scaling_factor"]),
        norm_topk_prob=False,
    )


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a DeepSeek-V2/V3 HF config (fields it leaves out or nulls take transformers' defaults; a
    null q_lora_rank means a plain q_proj). num_key_value_heads and head_dim are transformers' bookkeeping for
    MLA: here the cache holds one row per token (num_kv_heads 1, head_dim kv_lora_rank + qk_rope_head_dim)."""
    hf = {**HF_DEFAULTS[arch], **{key: value for key, value in hf.items() if value is not None or key in KEPT_NULL}}
    _check_routing(hf, arch)
    if field(hf, "num_experts_per_tok") is None:
        raise ConfigError(f"no num_experts_per_tok; a {arch} config sets how many experts route each token")
    fields = common_fields(hf, arch)
    moe = moe_fields(hf, "n_routed_experts", int(hf["moe_intermediate_size"]))
    return ModelConfig(
        **latent_fields(hf, fields, arch == V2 or bool(hf["rope_interleave"])),
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
        dense_layers=tuple(range(min(int(hf["first_k_dense_replace"]), fields["num_layers"]))),
        mtp_layers=int(field(hf, "num_nextn_predict_layers", field(hf, "num_mtp_layers", int(arch == V3)))),
        **_routing_fields(hf, arch, moe),
        **moe,
    )


FAMILY = Family("deepseek", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
