"""poolside Laguna (`LagunaForCausalLM`: laguna-XS.2): GLM-4.5's MoE layer (models/glm4_moe) under gated attention
with sliding layers, as transformers' modeling_laguna has it.

- Attention is Qwen3's (per-head q/k RMSNorms before the rotation, q/k/v/o biases with `attention_bias`) on the
  layers `layer_types` marks `full_attention` or `sliding_attention` (over `sliding_window` tokens); each kind
  rotates with its own `rope_parameters` entry: theta and the leading `partial_rotary_factor` of the head (the
  sliding layers' through `cfg.local_rope_theta` / `cfg.local_rotary_dim`).
- The attention output is gated by softplus(h @ g_proj) before o_proj (`cfg.output_gate`), one gate per head
  (`gating` true or "per-head": `head_gate` [D, H], LFM3's leaf).
- `mlp_layer_types` marks each MLP "dense" (`intermediate_size`) or "sparse": `num_experts_per_tok` of
  `num_experts` experts by sigmoid score with `e_score_correction_bias` added for choosing only, renormalised and
  times `moe_routed_scaling_factor`, beside an ungated shared expert of `shared_expert_intermediate_size` (GLM-4.5's
  routed block with one group). Checkpoint names: `mlp.experts.{e}.*`, `mlp.experts.e_score_correction_bias`,
  `mlp.shared_expert.*`.

Refused by name: "per-element" gating, per-layer query head counts (`num_attention_heads_per_layer` not all
`num_attention_heads`), a router logit softcap and router weights applied on the input (transformers refuses it too).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.config.layer_type_rope import layer_type_rope
from jaxinfer.config.model import (
    LAYER_TYPES,
    REQUIRED_FIELDS,
    ConfigError,
    ModelConfig,
    activation_name,
    common_fields,
    field,
)
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.glm4_moe import Glm4MoeLayerWeights, decoder_layer
from jaxinfer.models.glm4_moe import abstract_layer as glm4_moe_layer
from jaxinfer.models.glm4_moe import hf_leaves as glm4_moe_hf_leaves
from jaxinfer.models.layers import Weight
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.shared_expert import shared_expert_hf_leaves
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("LagunaForCausalLM",)
GATINGS = (True, "per-head")
THETAS = {"full_attention": 500_000.0, "sliding_attention": 10_000.0}
# LagunaConfig's defaults for the fields a config may leave out (or null).
HF_DEFAULTS = dict(intermediate_size=8192, num_key_value_heads=8, max_position_embeddings=131072, num_experts=256,
                   num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                   sliding_window=512, head_dim=128, attention_bias=False, gating=True, moe_routed_scaling_factor=1.0,
                   moe_apply_router_weight_on_input=False, moe_router_logit_softcapping=0.0,
                   rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 500000.0,
                                                       "partial_rotary_factor": 0.5},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                                          "partial_rotary_factor": 1.0}})


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DenseLayer(LayerWeights):
    """A layer with a dense MLP."""

    head_gate: Weight | None = None  # [D, H]: the output gate's (None only because the parent's fields have defaults)

    PROJECTIONS: ClassVar[dict[str, int]] = {**LayerWeights.PROJECTIONS, "head_gate": 1}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MoELayer(Glm4MoeLayerWeights):
    """A layer with routed experts beside a shared one."""

    head_gate: Weight | None = None  # [D, H]

    PROJECTIONS: ClassVar[dict[str, int]] = {**Glm4MoeLayerWeights.PROJECTIONS, "head_gate": 1}


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> Any:
    """GLM-4.5's layer `layer` (dense or MoE) with the output gate's weight."""
    base = glm4_moe_layer(cfg, layer)
    kind = DenseLayer if isinstance(base, LayerWeights) else MoELayer
    return kind(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                head_gate=ArrayInfo((cfg.hidden_size, cfg.num_heads), ("embed", "q_heads")))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """GLM-4.5's names but for the correction bias's and the shared expert's, and the output gate."""
    mlp = "model.layers.{i}.mlp."
    return {
        **glm4_moe_hf_leaves(cfg),
        "score_correction": HFLeaf(mlp + "experts.e_score_correction_bias", "same", (cfg.num_experts,)),
        **shared_expert_hf_leaves(cfg, mlp, "shared_expert.", gated=False),
        "head_gate": HFLeaf("model.layers.{i}.self_attn.g_proj.weight", "transpose", (cfg.num_heads, cfg.hidden_size)),
    }


def check_supported(hf: Mapping[str, Any], arch: str) -> None:
    """Refuse by name what transformers' Laguna runs and this family does not."""
    heads = hf.get("num_attention_heads_per_layer")
    if heads is not None and set(heads) != {hf["num_attention_heads"]}:
        raise ConfigError(f"num_attention_heads_per_layer {heads!r} is not supported for {arch}: every layer with "
                          f"num_attention_heads ({hf['num_attention_heads']}) query heads only")
    if hf["gating"] not in GATINGS:
        raise ConfigError(f"gating {hf['gating']!r} is not supported for {arch}; supported: true or 'per-head' (one "
                          "softplus gate per head)")
    for name, value in (("moe_router_logit_softcapping", 0.0), ("moe_apply_router_weight_on_input", False)):
        if hf[name] != value:
            raise ConfigError(f"{name} {hf[name]!r} is not supported for {arch}; supported: {value!r}")


def rope_dims(hf: Mapping[str, Any], head_dim: int, kind: str) -> int:
    """The head dims layers of `kind` rotate: the leading partial_rotary_factor of head_dim."""
    factor = float((hf["rope_parameters"].get(kind) or {}).get("partial_rotary_factor", 1.0))
    return int(head_dim * factor)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Laguna HF config (LagunaConfig's defaults where a key is absent or null)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    check_supported(hf, arch)
    if not set(hf["rope_parameters"]) <= set(LAYER_TYPES):
        raise ConfigError(f"rope_parameters {hf['rope_parameters']!r} is not supported for {arch}: one set per layer "
                          f"type ({', '.join(LAYER_TYPES)}), as LagunaConfig writes them")
    fields = common_fields({k: v for k, v in hf.items() if k != "rope_parameters"}, arch)
    layers, head_dim, window = fields["num_layers"], fields["head_dim"], int(hf["sliding_window"])
    kinds = hf.get("layer_types") or ["full_attention"] * layers
    mlps = field(hf, "mlp_layer_types", ["dense"] + ["sparse"] * (layers - 1))
    if len(kinds) != layers or not set(kinds) <= set(LAYER_TYPES) or len(mlps) != layers or \
            not set(mlps) <= {"dense", "sparse"}:
        raise ConfigError(f"layer_types {kinds!r} and mlp_layer_types {mlps!r} must give each of the {layers} layers "
                          f"one of {list(LAYER_TYPES)} and one of ['dense', 'sparse']")
    theta, scaling, local_theta = layer_type_rope(hf, THETAS, "rope_parameters.sliding_attention", arch)
    moe = moe_fields(hf, "num_experts", int(hf["moe_intermediate_size"]), experts=256, per_token=8)
    bias = bool(hf["attention_bias"])
    return ModelConfig(
        **{**fields, "rope_theta": theta, "rope_scaling": scaling},
        local_rope_theta=local_theta,
        rotary_dim=rope_dims(hf, head_dim, "full_attention"),
        local_rotary_dim=rope_dims(hf, head_dim, "sliding_attention"),
        layer_windows=tuple(window if kind == "sliding_attention" else 0 for kind in kinds),
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        output_gate="softplus",
        activation=activation_name(hf.get("hidden_act") or "silu"),
        dense_layers=tuple(i for i, kind in enumerate(mlps) if kind == "dense"),
        shared_expert_intermediate_size=int(hf["shared_expert_intermediate_size"]),
        norm_topk_prob=True,
        routed_scaling_factor=float(hf["moe_routed_scaling_factor"]),
        **moe,
    )


FAMILY = Family("laguna", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                required=REQUIRED_FIELDS)
