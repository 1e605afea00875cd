"""Arcee's AFMoE (AfmoeForCausalLM: Trinity): a sandwich layer (Kolibri-1's) with a gated attention output over
GLM-4.5's routed experts with one group.

As transformers' modular_afmoe has it:

- Each sublayer's input and output are RMS-normed (`input_layernorm` / `post_attention_layernorm` around attention,
  `pre_mlp_layernorm` / `post_mlp_layernorm` around the MLP) before the residual add.
- Attention: per-head q/k RMSNorms before the rotation, q/k/v/o biased by `attention_bias`, the output times
  sigmoid(x @ gate_proj) per head and dim before o_proj (`attn_gate`, Qwen3-Next's). `layer_types` marks each layer
  sliding (over `sliding_window`) or full (by default every `global_attn_every_n_layers`-th); only the sliding
  layers rotate q and k, the full ones attend without positions (`cfg.nope_layers`).
- The first `num_dense_layers` layers have a dense gated MLP; the others route to `num_experts_per_tok` of
  `num_experts` experts by float32 sigmoid score plus `expert_bias` (for choosing only), renormalised (+1e-20) and
  scaled by `route_scale`, beside a gated shared MLP of num_shared_experts x moe_intermediate_size.
- `mup_enabled` scales the embeddings by sqrt(hidden_size) (`cfg.embedding_multiplier`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.config.model import LAYER_TYPES, ConfigError, ModelConfig, activation_name, common_fields
from jaxinfer.config.typed_windows import windows_by_type
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.gemma2 import sandwich_layer
from jaxinfer.models.glm4_moe import abstract_layer as glm4_moe_layer
from jaxinfer.models.glm4_moe import moe_block
from jaxinfer.models.kolibri1 import SandwichMoELayerWeights
from jaxinfer.models.layers import Weight
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.moe import is_dense
from jaxinfer.models.qwen3_moe import hf_leaves as qwen3_moe_hf_leaves
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.shared_expert import shared_expert_hf_leaves
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("AfmoeForCausalLM",)
# AfmoeConfig's defaults for the fields a config may leave out (or null) where ours differ.
DEFAULTS = dict(vocab_size=200192, intermediate_size=6144, moe_intermediate_size=1408, num_dense_layers=1,
                head_dim=128, max_position_embeddings=16384, rms_norm_eps=1e-5, num_experts=64, num_experts_per_tok=6,
                num_shared_experts=2, route_scale=1.0, global_attn_every_n_layers=4, sliding_window=1024,
                mup_enabled=False, attention_bias=False)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DenseLayer(LayerWeights):
    """A dense AFMoE layer: Llama's leaves, the output gate and each sublayer's output norm."""

    attn_gate: Weight | None = None  # [D, H, K]
    post_attn_norm: jax.Array | None = None  # [D]
    post_mlp_norm: jax.Array | None = None  # [D]

    PROJECTIONS: ClassVar[dict[str, int]] = {**LayerWeights.PROJECTIONS, "attn_gate": 1}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MoELayer(SandwichMoELayerWeights):
    """An MoE AFMoE layer: Kolibri-1's sandwich over GLM-4.5's experts, with the output gate."""

    attn_gate: Weight | None = None  # [D, H, K]

    PROJECTIONS: ClassVar[dict[str, int]] = {**SandwichMoELayerWeights.PROJECTIONS, "attn_gate": 1}


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> DenseLayer | MoELayer:
    """GLM-4.5's layer `layer` (dense or routed) with the output gate and the output norms."""
    base = glm4_moe_layer(cfg, layer)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    D, H, K = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    norm = ArrayInfo((D,), ("embed",), init_value=1.0)
    gate = ArrayInfo((D, H, K), ("embed", "q_heads", "head_dim"))
    fields.update(attn_gate=gate, post_attn_norm=norm, post_mlp_norm=norm)
    return DenseLayer(**fields) if is_dense(base) else MoELayer(**fields)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Qwen3-MoE's names (attention, dense MLP, per-expert tensors) with AFMoE's norms, gate, router and shared MLP."""
    D, E, H, K = cfg.hidden_size, cfg.num_experts, cfg.num_heads, cfg.head_dim
    layer, mlp = "model.layers.{i}.", "model.layers.{i}.mlp."
    return {
        **qwen3_moe_hf_leaves(cfg),
        "post_attn_norm": HFLeaf(layer + "post_attention_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf(layer + "pre_mlp_layernorm.weight", "same", (D,)),
        "post_mlp_norm": HFLeaf(layer + "post_mlp_layernorm.weight", "same", (D,)),
        "attn_gate": HFLeaf(layer + "self_attn.gate_proj.weight", "in_heads", (H * K, D), H, K),
        "router": HFLeaf(mlp + "router.gate.weight", "transpose", (E, D)),
        "score_correction": HFLeaf(mlp + "expert_bias", "same", (E,)),
        **shared_expert_hf_leaves(cfg, mlp, "shared_experts.", gated=False),
    }


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: DenseLayer | MoELayer, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """norm -> gated attention -> norm -> residual add, then norm -> MLP or experts -> norm -> residual add."""

    def mlp(h: jax.Array, layout: Layout) -> jax.Array:
        if is_dense(lw):
            return gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation)
        return moe_block(h, lw, cfg, layout)

    return sandwich_layer(cfg, x, cache, lw, layer, positions, rope, mlp)


def layer_kinds(hf: Mapping[str, Any], arch: str, num_layers: int) -> list[str]:
    """`layer_types`, or AfmoeConfig's: full every `global_attn_every_n_layers`-th layer, sliding otherwise."""
    every = int(hf["global_attn_every_n_layers"])
    if every < 1 and not hf.get("layer_types"):
        raise ConfigError(f"global_attn_every_n_layers {every} must be >= 1 for {arch}")
    kinds = hf.get("layer_types") or ["sliding_attention" if (i + 1) % every else "full_attention"
                                      for i in range(num_layers)]
    if len(kinds) != num_layers or not set(kinds) <= set(LAYER_TYPES):
        raise ConfigError(f"layer_types {kinds!r} must give one of {list(LAYER_TYPES)} for each of the {num_layers} "
                          f"layers of {arch}")
    return kinds


def routing_fields(hf: Mapping[str, Any], arch: str, num_layers: int) -> dict[str, Any]:
    """The MoE layers' experts, top k (always renormalised, then scaled by route_scale) and shared MLP, checked."""
    experts, per_token, shared = int(hf["num_experts"]), int(hf["num_experts_per_tok"]), int(hf["num_shared_experts"])
    if not 1 <= per_token <= experts:
        raise ConfigError(f"num_experts_per_tok {per_token} must be in [1, num_experts ({experts})] for {arch}")
    if shared < 1:
        raise ConfigError(f"num_shared_experts {shared} is not supported for {arch}: >= 1 only (transformers builds "
                          "the shared MLP in every MoE layer)")
    width = int(hf["moe_intermediate_size"])
    return dict(num_experts=experts, experts_per_token=per_token, moe_intermediate_size=width, norm_topk_prob=True,
                routed_scaling_factor=float(hf["route_scale"]), shared_expert_intermediate_size=shared * width,
                dense_layers=tuple(range(min(int(hf["num_dense_layers"]), num_layers))))


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an AFMoE HF config (fields it leaves out or nulls take AfmoeConfig's defaults)."""
    hf = {**DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    fields = common_fields(hf, arch)
    layers = fields["num_layers"]
    kinds = layer_kinds(hf, arch, layers)
    windows = windows_by_type(kinds, int(hf["sliding_window"]), arch)
    bias = bool(hf["attention_bias"])
    return ModelConfig(
        **fields,
        layer_windows=windows,
        nope_layers=tuple(i for i, kind in enumerate(kinds) if kind == "full_attention"),
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        embedding_multiplier=fields["hidden_size"] ** 0.5 if hf["mup_enabled"] else 1.0,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        **routing_fields(hf, arch, layers),
    )


FAMILY = Family("afmoe", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
