"""Beam (`BeamForCausalLM`): AFMoE's sandwich layer with a per-head gate bias, depth-scaled residual adds, NoPE full
layers with a scalable-softmax query scale, and DeepSeek-V3's grouped routing without shared experts.

As transformers' modular_beam has it:

- Each sublayer's input and output are RMS-normed (`input_layernorm` / `post_attention_layernorm`,
  `pre_feedforward_layernorm` / `post_feedforward_layernorm`; OLMo 3's norm: scaled in float32, then cast). The
  residual add of a layer's attention (add 2 (layer + 1)) and MLP (add 2 (layer + 1) + 1) is depth-scaled:
  out / sqrt(n) + residual * sqrt((n - 1) / n); the scales ride with the layer's weights as data
  (`placed_layer.PlacedLayer.scalars`), so every layer still shares one trace.
- Attention (Qwen3's): per-head q/k RMSNorms before the rotation, q/k/v/o biased by `attention_bias`, the output
  times sigmoid(gate_proj(h) + gate_bias) (a bias per head) per head and dim before o_proj. `layer_types` marks
  each layer sliding (over `sliding_window`) or full (by default every sixth and the last); `rope_parameters` is
  per layer type, None for a type without rotary embeddings (the full layers, by default), whose queries are scaled
  by (1 + (position + 1) / 2048) ** 0.1.
- `mlp_layer_types` marks each MLP dense (by default the first three) or sparse: `num_experts_per_tok` of
  `num_experts` experts by float32 sigmoid score plus `e_score_correction_bias` (for choosing only) within the best
  `topk_group` of `n_group` groups, renormalised, times `routed_scaling_factor`; no shared experts.
- The logits are soft-capped by `final_logit_softcapping` (30).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import LAYER_TYPES, ConfigError, ModelConfig, activation_name, common_fields
from jaxinfer.config.rope_scaling import RopeScaling, rope_fields
from jaxinfer.config.typed_windows import windows_by_type
from jaxinfer.models.afmoe import DenseLayer, MoELayer
from jaxinfer.models.afmoe import abstract_layer as afmoe_layer
from jaxinfer.models.attention import attend
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.glm4_moe import hf_leaves as glm4_moe_hf_leaves
from jaxinfer.models.glm4_moe import moe_block
from jaxinfer.models.grouped_topk import check_groups
from jaxinfer.models.layers import linear
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.moe import is_dense
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.placed_layer import PlacedLayer, placed
from jaxinfer.models.rope import CosSin, RopeTables
from jaxinfer.models.self_attention import HIDDEN, Q_HEADS, project_qkv
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("BeamForCausalLM",)
SSMAX_LENGTH, SSMAX_POWER = 2048, 0.1  # the NoPE layers' query scale: (1 + (position + 1) / 2048) ** 0.1
# BeamConfig's defaults for the fields a config may leave out (or null) where ours differ.
DEFAULTS = dict(vocab_size=151936, hidden_size=5120, intermediate_size=20480, num_hidden_layers=52,
                num_attention_heads=48, num_key_value_heads=8, head_dim=128, max_position_embeddings=8192,
                rms_norm_eps=1e-6, sliding_window=512, moe_intermediate_size=2560, num_experts=256,
                num_experts_per_tok=8, norm_topk_prob=True, n_group=8, topk_group=4, routed_scaling_factor=2.5,
                final_logit_softcapping=30.0, attention_bias=False)
DEFAULT_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}, "full_attention": None}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class BeamDenseLayer(DenseLayer):
    """AFMoE's dense layer with the output gate's bias."""

    gate_bias: jax.Array | None = None  # [H]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class BeamMoELayer(MoELayer):
    """AFMoE's MoE layer (no shared experts) with the output gate's bias."""

    gate_bias: jax.Array | None = None  # [H]


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> BeamDenseLayer | BeamMoELayer:
    """AFMoE's layer `layer` with the gate's bias."""
    base = afmoe_layer(cfg, layer)
    kind = BeamDenseLayer if isinstance(base, DenseLayer) else BeamMoELayer
    return kind(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                gate_bias=ArrayInfo((cfg.num_heads,), ("q_heads",), init_value=0.0))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """GLM-4.5's names (Qwen3-MoE's with the correction bias) with Beam's norms and output gate."""
    D, H, K = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    layer, attn = "model.layers.{i}.", "model.layers.{i}.self_attn."
    return {
        **glm4_moe_hf_leaves(cfg),
        "post_attn_norm": HFLeaf(layer + "post_attention_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf(layer + "pre_feedforward_layernorm.weight", "same", (D,)),
        "post_mlp_norm": HFLeaf(layer + "post_feedforward_layernorm.weight", "same", (D,)),
        "attn_gate": HFLeaf(attn + "gate_proj.weight", "in_heads", (H * K, D), H, K),
        "gate_bias": HFLeaf(attn + "gate_bias", "same", (H,)),
    }


def residual_scales(layer: int) -> tuple[float, ...]:
    """(output, residual) scales of layer `layer`'s attention add, then its MLP's: 1 / sqrt(n), sqrt((n - 1) / n)
    for residual add n."""
    adds = (2 * (layer + 1), 2 * (layer + 1) + 1)
    return tuple(scale for n in adds for scale in (1.0 / math.sqrt(n), math.sqrt((n - 1) / n)))


def borrowed_leaves(cfg: ModelConfig, layers: list[Any], layer: int) -> PlacedLayer:
    """Layer `layer`'s weights with its residual scales (as data)."""
    return placed(layers[layer], jnp.asarray(residual_scales(layer), dtype=jnp.float32))


def query_scale(positions: jax.Array) -> jax.Array:
    """The NoPE layers' scalable-softmax query scale [B, T, 1, 1], float32."""
    grown = jnp.log1p((positions.astype(jnp.float32) + 1) / SSMAX_LENGTH)
    return jnp.exp(SSMAX_POWER * grown)[:, :, None, None]


def attention(
    cfg: ModelConfig, h: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: CosSin | None,
) -> tuple[jax.Array, Any]:
    """Qwen3's attention (NoPE queries scaled) with the biased sigmoid output gate: [B, T, D]."""
    layout = cache.layout
    q, k, v = project_qkv(h, lw, cfg, rope, layout)
    if rope is None:
        q = (q.astype(jnp.float32) * query_scale(positions)).astype(q.dtype)
    cache = cache.write(layer, k, v, positions)
    out = attend(q, cache, layer, positions, cfg.layer_windows[layer])
    gate = linear(h, lw.attn_gate) + lw.gate_bias[:, None].astype(h.dtype)
    out = linear(layout.constrain(out * jax.nn.sigmoid(gate), Q_HEADS), lw.wo, contract=2)
    return (out if lw.bo is None else out + lw.bo), cache


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, place: PlacedLayer, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """norm -> gated attention -> norm -> depth-scaled add, then the same around the dense MLP or the experts."""
    lw, layout, eps = place.weights, cache.layout, cfg.rms_norm_eps
    attn_out, attn_res, mlp_out, mlp_res = (s.astype(x.dtype) for s in place.scalars)

    def norm(t: jax.Array, weight: jax.Array) -> jax.Array:
        return rms_norm(t, weight, eps, scale_first=True)

    out, cache = attention(cfg, norm(x, lw.attn_norm), cache, lw, layer, positions, rope.for_layer(layer))
    x = layout.constrain(norm(out, lw.post_attn_norm) * attn_out + x * attn_res, HIDDEN)
    h = norm(x, lw.mlp_norm)
    h = gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation) if is_dense(lw) else moe_block(h, lw, cfg, layout)
    return layout.constrain(norm(h, lw.post_mlp_norm) * mlp_out + x * mlp_res, HIDDEN), cache


def _kinds(hf: Mapping[str, Any], key: str, default: list[str], accepted: tuple[str, ...], arch: str) -> list[str]:
    """A per-layer list (`layer_types`, `mlp_layer_types`) or BeamConfig's default, checked."""
    kinds = hf.get(key) or default
    if len(kinds) != len(default) or not set(kinds) <= set(accepted):
        raise ConfigError(f"{key} {kinds!r} must give one of {list(accepted)} for each of the {len(default)} layers "
                          f"of {arch}")
    return list(kinds)


def rope_by_kind(hf: Mapping[str, Any], kinds: list[str], arch: str) -> dict[str, Any]:
    """rope_theta / rope_scaling (the full layers'), local_rope_theta (the sliding ones', unscaled) and nope_layers
    from the per-type `rope_parameters` (None: that type has no rotary embeddings)."""
    params = hf.get("rope_parameters") or DEFAULT_ROPE
    if not set(params) <= set(LAYER_TYPES):
        raise ConfigError(f"rope_parameters {params!r} is not supported for {arch}: one set (or null) per layer type, "
                          f"keyed by {list(LAYER_TYPES)}")
    full, sliding = params.get("full_attention"), params.get("sliding_attention")
    out = dict(nope_layers=tuple(i for i, kind in enumerate(kinds) if params.get(kind) is None))
    if full is not None:
        out["rope_theta"], out["rope_scaling"] = rope_fields(hf, full)
    if sliding is not None:
        theta, scaling = rope_fields(hf, sliding)
        if scaling != RopeScaling():
            raise ConfigError(f"rope_parameters.sliding_attention {sliding!r} is not supported for {arch}: the "
                              "sliding layers take the default rope with their own rope_theta")
        out["local_rope_theta"] = theta
        out.setdefault("rope_theta", theta)
    return out


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Beam HF config (fields it leaves out or nulls take BeamConfig's defaults)."""
    cap = hf.get("final_logit_softcapping", DEFAULTS["final_logit_softcapping"])  # null: no cap, as transformers
    hf = {**DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    fields = common_fields({**hf, "rope_parameters": None}, arch)  # rope: per layer type, read below
    layers = fields["num_layers"]
    pattern = ["sliding_attention" if (i + 1) % 6 and i < layers - 1 else "full_attention" for i in range(layers)]
    kinds = _kinds(hf, "layer_types", pattern, LAYER_TYPES, arch)
    dense = min(3, layers)
    mlps = _kinds(hf, "mlp_layer_types", ["dense"] * dense + ["sparse"] * (layers - dense), ("dense", "sparse"), arch)
    windows = windows_by_type(kinds, int(hf["sliding_window"]), arch)
    moe = moe_fields(hf, "num_experts", int(hf["moe_intermediate_size"]), experts=256, per_token=8)
    groups, groups_per_token = int(hf["n_group"]), int(hf["topk_group"])
    check_groups(moe["num_experts"], groups, groups_per_token, moe["experts_per_token"])
    bias = bool(hf["attention_bias"])
    return ModelConfig(
        **{**fields, **rope_by_kind(hf, kinds, arch)},
        layer_windows=windows,
        qkv_bias=bias, o_bias=bias, qk_norm=True, norm_scale_first=True,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        final_soft_cap=None if cap is None else float(cap),
        dense_layers=tuple(i for i, kind in enumerate(mlps) if kind == "dense"),
        norm_topk_prob=bool(hf["norm_topk_prob"]), expert_groups=groups, expert_groups_per_token=groups_per_token,
        routed_scaling_factor=float(hf["routed_scaling_factor"]), **moe,
    )


FAMILY = Family("beam", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                borrowed_leaves=borrowed_leaves)
