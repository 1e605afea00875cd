"""Muse Spark (text): MuseSparkForConditionalGeneration's language model run text-only.

transformers 5.24's MuseSparkTextModel is Muse Glimmer's (models/muse_glimmer: weightless q/k norms before the
rotation, q x `qk_scale_factor`, a sigmoid gate per head and dim, normed embeddings, NoPE layers from
`layer_rope_theta`, logits x `output_multiplier` then soft-capped) with:
- each head's attention output RMS-normed without a weight before the gate (`cfg.attn_out_norm`);
- a residual gate after each sublayer: alpha * residual + beta * out, beta = sigmoid(g / T), alpha =
  sqrt(max(sigmoid(-g / T) * (1 + beta), 1e-3)) with a float32 [D] parameter g per gate and T
  `residual_gate_temperature`; the attention's output normed without a weight first, the MLP's "input-scaled":
  RMSNorm(x * (1 + w)), both at `post_norm_eps`;
- `mlp_layer_types` "sparse" (all by default): a float32 router on the layer's input (logits x
  `output_multiplier`, sigmoid scores, `e_score_correction_bias` for choosing only, renormalised, x
  `routed_scaling_factor`), the input projected to `moe_hidden_size` and normed (1 + w), `num_experts_per_tok` of
  `num_local_experts` SwiGLU experts at that width, each expert's output input-scaled-normed (`post_expert_norm`)
  before it is weighted, the sum projected back; "dense": Gemma 2's gated MLP.
The checkpoint keeps the language model under `model.language_model.*` (the experts in two stacked tensors,
`experts.gate_up_proj` [E, 2F, M] and `experts.down_proj` [E, M, F]) beside the vision and audio towers, never read
(models/text_part): an image or audio is refused by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.grouped_topk import grouped_topk
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.mlp import gated_mlp, mlp_hf_leaves, mlp_leaves
from jaxinfer.models.moe import DOWN_AXES, GATE_AXES, ROUTER_AXES, experts_output
from jaxinfer.models.muse_glimmer import attention_fields
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, attention_hf_leaves, attention_leaves, self_attention
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("MuseSparkForConditionalGeneration",)
# MuseSparkTextConfig's defaults for the fields a config may leave out (or null).
HF_DEFAULTS = dict(vocab_size=202_048, hidden_size=8192, intermediate_size=16384, num_hidden_layers=62,
                   num_attention_heads=128, num_key_value_heads=16, head_dim=64, max_position_embeddings=1_048_576,
                   rms_norm_eps=1e-5, bos_token_id=200_000, eos_token_id=200_001, sliding_window=2048,
                   final_logit_softcapping=20.0, qk_scale_factor=5.4730064863875,
                   output_multiplier=0.1767766952966369, post_norm_eps=1e-8, moe_intermediate_size=4096,
                   num_local_experts=256, num_experts_per_tok=8, routed_scaling_factor=1.0, moe_hidden_size=4096,
                   residual_gate_temperature=0.3, rope_parameters={"rope_type": "default", "rope_theta": 500_000.0})
RESIDUAL_GATE_FLOOR = 1e-3  # MuseSparkResidualGate's eps
ROUTER_EPS = 1e-15  # MuseSparkTopkRouter's norm_topk_prob_eps


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MuseSparkLayer:
    """One layer: gated attention, then the dense MLP (w_*) or the experts at moe_hidden_size M (the rest)."""

    attn_norm: jax.Array  # [D] input_layernorm (1 + w)
    wq: Weight  # [D, H, K]
    wk: Weight  # [D, KV, K]
    wv: Weight  # [D, KV, K]
    wo: Weight  # [H, K, D]
    attn_gate: Weight  # [D, H, K]
    attn_residual_gate: jax.Array  # [D] float32
    mlp_norm: jax.Array  # [D] pre_feedforward_layernorm (1 + w)
    post_mlp_norm: jax.Array  # [D] post_feedforward_layernorm (input-scaled)
    mlp_residual_gate: jax.Array  # [D] float32
    w_gate: Weight | None = None  # [D, F]
    w_up: Weight | None = None  # [D, F]
    w_down: Weight | None = None  # [F, D]
    router: jax.Array | None = None  # [D, E] float32
    score_correction: jax.Array | None = None  # [E] float32
    pre_expert_proj: Weight | None = None  # [D, M]
    pre_expert_norm: jax.Array | None = None  # [M] (1 + w)
    moe_gate: Any = None  # [E, M, F]
    moe_up: Any = None  # [E, M, F]
    moe_down: Any = None  # [E, F, M]
    post_expert_norm: jax.Array | None = None  # [M] (input-scaled)
    post_expert_proj: Weight | None = None  # [M, D]
    bq: jax.Array | None = None
    bk: jax.Array | None = None
    bv: jax.Array | None = None
    bo: jax.Array | None = None
    q_norm: jax.Array | None = None
    k_norm: jax.Array | None = None

    PROJECTIONS: ClassVar[dict[str, int]] = {"wq": 1, "wk": 1, "wv": 1, "wo": 2, "attn_gate": 1, "w_gate": 1,
                                             "w_up": 1, "w_down": 1, "pre_expert_proj": 1, "post_expert_proj": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("wq", "wk", "wv"), ("w_gate", "w_up"))


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> MuseSparkLayer:
    """Layer `layer`'s leaves: the dense MLP's or the experts' (norm weights stored as w - 1, start at 0)."""
    D, H, K, E, F, M = (cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.num_experts, cfg.moe_intermediate_size,
                        cfg.moe_hidden_size)
    norm = ArrayInfo((D,), ("embed",), init_value=0.0)
    gate = ArrayInfo((D,), ("embed",), dtype="float32")
    common = dict(attn_norm=norm, **attention_leaves(cfg), attn_gate=ArrayInfo((D, H, K), ("embed", "q_heads",
                  "head_dim")), attn_residual_gate=gate, mlp_norm=norm, post_mlp_norm=norm, mlp_residual_gate=gate)
    if not cfg.is_moe_layer(layer):
        return MuseSparkLayer(**common, **mlp_leaves(D, cfg.intermediate_size))
    return MuseSparkLayer(
        **common,
        router=ArrayInfo((D, E), ROUTER_AXES, dtype="float32"),
        score_correction=ArrayInfo((E,), (None,), init_value=0.0, dtype="float32"),
        pre_expert_proj=ArrayInfo((D, M), ("embed", None)),
        pre_expert_norm=ArrayInfo((M,), (None,), init_value=0.0),
        moe_gate=ArrayInfo((E, M, F), GATE_AXES),
        moe_up=ArrayInfo((E, M, F), GATE_AXES),
        moe_down=ArrayInfo((E, F, M), DOWN_AXES),
        post_expert_norm=ArrayInfo((M,), (None,), init_value=0.0),
        post_expert_proj=ArrayInfo((M, D), (None, "embed")),
    )


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives (under `model.layers.{i}.`: text_part reads them from model.language_model.)."""
    D, E, F, M = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, cfg.moe_hidden_size
    H, K = cfg.num_heads, cfg.head_dim
    layer, mlp = "model.layers.{i}.", "model.layers.{i}.mlp."
    gate_up = (mlp + "experts.gate_up_proj", "transpose", (E, 2 * F, M))
    return {
        "attn_norm": HFLeaf(layer + "input_layernorm.weight", "same", (D,)),
        **attention_hf_leaves(cfg),
        "attn_gate": HFLeaf(layer + "self_attn.gate_proj.weight", "in_heads", (H * K, D), H, K),
        "attn_residual_gate": HFLeaf(layer + "post_attention_residual_gate.gate", "same", (D,)),
        "mlp_norm": HFLeaf(layer + "pre_feedforward_layernorm.weight", "same", (D,)),
        "post_mlp_norm": HFLeaf(layer + "post_feedforward_layernorm.weight", "same", (D,)),
        "mlp_residual_gate": HFLeaf(layer + "post_feedforward_residual_gate.gate", "same", (D,)),
        **mlp_hf_leaves(D, cfg.intermediate_size),
        "router": HFLeaf(mlp + "gate.weight", "transpose", (E, D)),
        "score_correction": HFLeaf(mlp + "gate.e_score_correction_bias", "same", (E,)),
        "pre_expert_proj": HFLeaf(mlp + "pre_expert_proj.weight", "transpose", (M, D)),
        "pre_expert_norm": HFLeaf(mlp + "pre_expert_norm.weight", "same", (M,)),
        "moe_gate": HFLeaf(*gate_up),
        "moe_up": HFLeaf(*gate_up, row_offset=F),
        "moe_down": HFLeaf(mlp + "experts.down_proj", "transpose", (E, M, F)),
        "post_expert_norm": HFLeaf(mlp + "experts.post_expert_norm.weight", "same", (M,)),
        "post_expert_proj": HFLeaf(mlp + "post_expert_proj.weight", "transpose", (D, M)),
    }


def input_scaled_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm(x * (1 + w)) without a weight, the product rounded to x's dtype first (MuseSparkTextInputScaledRMSNorm).
    """
    scaled = (x.astype(jnp.float32) * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)
    return rms_norm(scaled, None, eps)


def residual_gate(residual: jax.Array, out: jax.Array, gate: jax.Array, temperature: float) -> jax.Array:
    """alpha * residual + beta * out in float32, in the residual's dtype (MuseSparkResidualGate)."""
    w = gate.astype(jnp.float32) / temperature
    beta = jax.nn.sigmoid(w)
    alpha = jnp.sqrt(jnp.maximum(jax.nn.sigmoid(-w) * (1.0 + beta), RESIDUAL_GATE_FLOOR))
    return (alpha * residual.astype(jnp.float32) + beta * out.astype(jnp.float32)).astype(residual.dtype)


def moe_block(h: jax.Array, lw: MuseSparkLayer, cfg: ModelConfig, layout: Layout) -> jax.Array:
    """The experts at moe_hidden_size, each output normed before it is weighted (one row per token and choice)."""
    shape = h.shape
    x = h.reshape(-1, shape[-1])
    logits = linear(x.astype(jnp.float32), lw.router) * cfg.router_logit_multiplier
    weights, experts = grouped_topk(logits, lw.score_correction, cfg.experts_per_token, 1, 1, True,
                                    cfg.routed_scaling_factor, epsilon=ROUTER_EPS)
    inner = rms_norm(linear(x, lw.pre_expert_proj), lw.pre_expert_norm, cfg.rms_norm_eps, 1.0)  # [N, M]
    n, k = experts.shape
    rows = jnp.repeat(inner, k, axis=0)  # row i * k + j: token i's j-th choice
    out = experts_output(rows, jnp.ones((n * k, 1), jnp.float32), experts.reshape(n * k, 1), lw, layout,
                         cfg.activation).astype(h.dtype)
    out = input_scaled_norm(out, lw.post_expert_norm, cfg.post_norm_eps)
    summed = jnp.sum(out.reshape(n, k, -1).astype(jnp.float32) * weights[:, :, None], axis=1).astype(h.dtype)
    return linear(summed, lw.post_expert_proj).reshape(shape)


def decoder_layer(cfg: ModelConfig, x, cache, lw: MuseSparkLayer, layer: int, positions, rope: RopeTables):
    """Attention and the MLP (dense or experts), each normed in and out and added through its residual gate."""
    layout: Layout = cache.layout
    eps, post_eps, temperature = cfg.rms_norm_eps, cfg.post_norm_eps, cfg.residual_gate_temperature
    out, cache = self_attention(cfg, rms_norm(x, lw.attn_norm, eps, 1.0), cache, lw, layer, positions,
                                rope.for_layer(layer))
    x = layout.constrain(residual_gate(x, rms_norm(out, None, post_eps), lw.attn_residual_gate, temperature), HIDDEN)
    h = rms_norm(x, lw.mlp_norm, eps, 1.0)
    h = moe_block(h, lw, cfg, layout) if lw.router is not None else \
        gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation)
    h = input_scaled_norm(h, lw.post_mlp_norm, post_eps)
    return layout.constrain(residual_gate(x, h, lw.mlp_residual_gate, temperature), HIDDEN), cache


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Muse Spark text config (MuseSparkTextConfig's defaults where a key is absent or null)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    fields = common_fields({k: v for k, v in hf.items() if k not in ("rope_parameters", "rope_scaling")}, arch)
    layers = fields["num_layers"]
    mlps = field(hf, "mlp_layer_types", ["sparse"] * layers)
    if len(mlps) != layers or not set(mlps) <= {"dense", "sparse"}:
        raise ConfigError(f"mlp_layer_types {mlps!r} is not supported for {arch}: 'dense' or 'sparse' for each of the "
                          f"{layers} layers")
    temperature = float(hf["residual_gate_temperature"])
    if temperature <= 0:
        raise ConfigError(f"residual_gate_temperature {temperature} is not supported for {arch}: a number > 0")
    attention = attention_fields(hf, arch, layers)
    multiplier = float(hf["output_multiplier"])
    return ModelConfig(
        **{**fields, "rope_theta": attention.pop("rope_theta")},
        **attention,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        embed_norm=True,
        qk_weightless_norm=True,
        attn_out_norm=True,
        attn_scale=float(hf["qk_scale_factor"]) * fields["head_dim"] ** -0.5,
        post_norm_eps=float(hf["post_norm_eps"]),
        norm_scale_first=True,
        logits_scaling=1.0 / multiplier,
        final_soft_cap=float(hf["final_logit_softcapping"]),
        num_experts=int(hf["num_local_experts"]),
        experts_per_token=int(hf["num_experts_per_tok"]),
        moe_intermediate_size=int(hf["moe_intermediate_size"]),
        dense_layers=tuple(i for i, kind in enumerate(mlps) if kind == "dense"),
        norm_topk_prob=True,
        routed_scaling_factor=float(hf["routed_scaling_factor"]),
        moe_hidden_size=int(hf["moe_hidden_size"]),
        residual_gate_temperature=temperature,
        router_logit_multiplier=multiplier,
    )


FAMILY = Family("muse_spark", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
