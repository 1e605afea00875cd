"""StepFun Step 3.7 (text): Step3p7ForConditionalGeneration's language model run text-only.

transformers 5.24's Step3p7TextModel (model_type step3p5) is Laguna's layer (models/laguna: Qwen3's per-head q/k
norms, sliding and full layers each with its own `rope_parameters` entry, theta and leading
`partial_rotary_factor`, one output gate per head from `g_proj`; GLM-4.5's sigmoid-routed experts with
`e_score_correction_bias` for choosing only, renormalised, times `moe_router_scaling_factor`, beside a gated shared
expert of `share_expert_dim`) with these changes read here:
- every RMSNorm (input, post-attention, q/k, final) scales by 1 + w (Gemma's; `cfg.norm_weight_offset` 1);
- the output gate is a sigmoid, and the scores are scaled by `query_pre_attn_scalar` ** -0.5;
- `swiglu_limits` (routed experts) and `swiglu_limits_shared` (shared expert and dense MLP) clamp, per layer,
  silu(gate) at the limit and up to [-limit, limit] (`mlp.SiLUClamped`; 0 or null: none);
- `mlp_layer_types` marks each MLP, the first three dense by default.
The checkpoint keeps StepFun's names (`model.layers.{i}.moe.{gate,up,down}_proj.weight` stacked over experts,
`moe.gate.weight`, `moe.router_bias`, `share_expert.*`) and its multi-token-prediction layers after the decoder's
(`num_nextn_predict_layers`, skipped). The vision tower (`vision_model.*`) and projector (`vit_large_projector.*`)
are not run (models/text_part): an image is refused by name.

Refused by name: sliding layers with their own query head count (`num_sliding_attention_heads`), per-element gating,
bidirectional attention, MLP biases, layer types other than full and sliding (MiniMax-M3's sparse attention), and the
hub's pre-transformers fields (`attention_other_setting`, `moe_layers_enum`, a `rope_theta` list,
`partial_rotary_factors`, `sparse_attention_config`, `moe_layer_freq`) transformers rewrites on load.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.layer_type_rope import layer_type_rope
from jaxinfer.config.model import LAYER_TYPES, REQUIRED_FIELDS, ConfigError, ModelConfig, common_fields, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.grouped_topk import grouped_topk
from jaxinfer.models.laguna import GATINGS, abstract_layer, rope_dims
from jaxinfer.models.laguna import hf_leaves as laguna_hf_leaves
from jaxinfer.models.layers import linear
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.mlp import Gate, SiLUClamped, gated_mlp
from jaxinfer.models.moe import experts_output, is_dense, pre_norm_layer
from jaxinfer.models.rope import RopeTables
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("Step3p7ForConditionalGeneration",)
THETAS = {"full_attention": 10_000.0, "sliding_attention": 10_000.0}
# Step3p7TextConfig's defaults for the fields a config may leave out (or null).
HF_DEFAULTS = dict(vocab_size=128815, hidden_size=4096, intermediate_size=11264, num_hidden_layers=45,
                   num_attention_heads=64, num_key_value_heads=8, head_dim=128, max_position_embeddings=128000,
                   num_experts_per_tok=8, n_routed_experts=288, moe_intermediate_size=1280, share_expert_dim=1280,
                   moe_router_scaling_factor=1.0, attention_bias=False, mlp_bias=False, gating=True,
                   use_bidirectional_attention=False, num_nextn_predict_layers=0, sliding_window=4096)
# Fields of StepFun's own config.json that transformers rewrites when it loads one (Step3p7TextConfig.__post_init__).
HUB_FIELDS = ("attention_other_setting", "moe_layers_enum", "partial_rotary_factors", "sparse_attention_config",
              "moe_layer_freq", "rope_theta", "rope_scaling")


def check_supported(hf: Mapping[str, Any], arch: str) -> None:
    """Refuse by name what transformers' Step 3.7 runs (or its hub config says) and this family does not."""
    for name in HUB_FIELDS:
        if hf.get(name) is not None:
            raise ConfigError(f"{name} {hf[name]!r} is not supported for {arch}: the hub's own config field; load "
                              "and save the checkpoint with transformers 5.24 (Step3p7Config), which rewrites it as "
                              "mlp_layer_types, num_sliding_attention_heads and rope_parameters per layer type")
    heads = hf.get("num_sliding_attention_heads")
    if heads is not None and heads != hf["num_attention_heads"]:
        raise ConfigError(f"num_sliding_attention_heads {heads!r} is not supported for {arch}: sliding layers with "
                          f"num_attention_heads ({hf['num_attention_heads']}) query heads only")
    if hf["gating"] not in GATINGS:
        raise ConfigError(f"gating {hf['gating']!r} is not supported for {arch}; supported: true or 'per-head'")
    for name in ("use_bidirectional_attention", "mlp_bias"):
        if hf[name]:
            raise ConfigError(f"{name} {hf[name]!r} is not supported for {arch}; supported: false")


def layer_limits(hf: Mapping[str, Any], name: str, num_layers: int) -> tuple[float, ...]:
    """Each layer's clamp from `name` (0 for none, as a 0, a null entry or no list means in transformers)."""
    limits = hf.get(name)
    if limits is None:
        return (0.0,) * num_layers
    if not isinstance(limits, list) or len(limits) != num_layers or any(v is not None and v < 0 for v in limits):
        raise ConfigError(f"{name} {limits!r} is not supported: one bound >= 0 (or null) for each of the "
                          f"{num_layers} layers")
    return tuple(float(v or 0.0) for v in limits)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Step 3.7 text config as transformers saves it (Step3p7TextConfig's defaults)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    check_supported(hf, arch)
    fields = common_fields({k: v for k, v in hf.items() if k != "rope_parameters"}, arch)
    layers, window = fields["num_layers"], int(hf["sliding_window"])
    kinds = field(hf, "layer_types", ["full_attention"] * layers)
    mlps = field(hf, "mlp_layer_types", ["dense" if i < 3 else "sparse" for i in range(layers)])
    if len(kinds) != layers or not set(kinds) <= set(LAYER_TYPES) or len(mlps) != layers or \
            not set(mlps) <= {"dense", "sparse"}:
        raise ConfigError(f"layer_types {kinds!r} and mlp_layer_types {mlps!r} are not supported for {arch}: one of "
                          f"{list(LAYER_TYPES)} and one of ['dense', 'sparse'] for each of the {layers} layers")
    params = hf.get("rope_parameters") or {}
    if not set(params) <= set(LAYER_TYPES):
        raise ConfigError(f"rope_parameters {params!r} is not supported for {arch}: one set per layer type "
                          f"({', '.join(LAYER_TYPES)}), as Step3p7TextConfig writes them")
    theta, scaling, local_theta = layer_type_rope(hf, THETAS, "rope_parameters.sliding_attention", arch)
    moe = moe_fields(hf, "n_routed_experts", int(hf["moe_intermediate_size"]), experts=288, per_token=8)
    bias = bool(hf["attention_bias"])
    return ModelConfig(
        **{**fields, "rope_theta": theta, "rope_scaling": scaling},
        local_rope_theta=local_theta,
        rotary_dim=rope_dims(hf, fields["head_dim"], "full_attention"),
        local_rotary_dim=rope_dims(hf, fields["head_dim"], "sliding_attention"),
        layer_windows=tuple(window if kind == "sliding_attention" else 0 for kind in kinds),
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        norm_weight_offset=1.0,
        attn_scale=float(field(hf, "query_pre_attn_scalar", fields["head_dim"])) ** -0.5,
        output_gate="sigmoid",
        dense_layers=tuple(i for i, kind in enumerate(mlps) if kind == "dense"),
        shared_expert_intermediate_size=int(hf["share_expert_dim"]),
        norm_topk_prob=True,
        routed_scaling_factor=float(hf["moe_router_scaling_factor"]),
        expert_swiglu_limits=layer_limits(hf, "swiglu_limits", layers),
        mlp_swiglu_limits=layer_limits(hf, "swiglu_limits_shared", layers),
        mtp_layers=int(hf["num_nextn_predict_layers"]),
        **moe,
    )


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Laguna's attention and dense-MLP names; StepFun's for the router, the stacked experts and the shared one."""
    D, E, F, S = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    moe, shared = "model.layers.{i}.moe.", "model.layers.{i}.share_expert."
    return {
        **laguna_hf_leaves(cfg),
        "router": HFLeaf(moe + "gate.weight", "transpose", (E, D)),
        "score_correction": HFLeaf(moe + "router_bias", "same", (E,)),
        "moe_gate": HFLeaf(moe + "gate_proj.weight", "transpose", (E, F, D)),
        "moe_up": HFLeaf(moe + "up_proj.weight", "transpose", (E, F, D)),
        "moe_down": HFLeaf(moe + "down_proj.weight", "transpose", (E, D, F)),
        "shared_gate": HFLeaf(shared + "gate_proj.weight", "transpose", (S, D)),
        "shared_up": HFLeaf(shared + "up_proj.weight", "transpose", (S, D)),
        "shared_down": HFLeaf(shared + "down_proj.weight", "transpose", (D, S)),
    }


def gate(limit: float, cfg: ModelConfig) -> Gate:
    """The MLP gate under a clamp of `limit` (0: the plain activation)."""
    return SiLUClamped(limit) if limit else cfg.activation


def moe_block(x: jax.Array, lw: Any, cfg: ModelConfig, layer: int, layout: Layout) -> jax.Array:
    """The routed experts (float32 sigmoid router, biased choice) plus the shared expert, each with its clamp."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    logits = linear(x2.astype(jnp.float32), lw.router)
    weights, experts = grouped_topk(logits, lw.score_correction, cfg.experts_per_token, 1, 1, True,
                                    cfg.routed_scaling_factor, epsilon=0.0)  # transformers adds none
    act = gate(cfg.expert_swiglu_limits[layer], cfg)
    routed = experts_output(x2, weights, experts, lw, layout, act).astype(x.dtype).reshape(shape)
    return routed + gated_mlp(x, lw.shared_gate, lw.shared_up, lw.shared_down, gate(cfg.mlp_swiglu_limits[layer], cfg))


def decoder_layer(cfg: ModelConfig, x, cache, lw, layer: int, positions, rope: RopeTables):
    """The pre-norm layer over the dense MLP or the experts, each with the layer's clamps."""
    if is_dense(lw):
        act = gate(cfg.mlp_swiglu_limits[layer], cfg)
        return pre_norm_layer(cfg, x, cache, lw, layer, positions, rope,
                              lambda h, layout: gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, act))
    return pre_norm_layer(cfg, x, cache, lw, layer, positions, rope,
                          lambda h, layout: moe_block(h, lw, cfg, layer, layout))


FAMILY = Family("step3p7", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                required=REQUIRED_FIELDS)
