"""RecursiveSI Flint (FlintForCausalLM): Qwen3-MoE's attention with sinks, NoPE full layers, sigmoid-routed experts.

As transformers' modeling_flint has it:

- Attention is Qwen3's (per-head q/k RMSNorms, q/k/v/o biased by `attention_bias`) with a learned sink logit per
  head in every softmax (GPT-OSS's; stored `self_attn.softmax_offset`). `layer_types` marks each layer full or
  sliding (by default full for the first two, every fourth from layer 1 and the last; `sliding_window` 513):
  only the sliding layers rotate q and k, the full ones attend without positions (NoPE: `cfg.nope_layers`).
- The MLP is dense in `mlp_only_layers` (by default the first two) and off the `decoder_sparse_step` stride;
  elsewhere `num_experts_per_tok` of `num_experts` experts chosen by the sigmoid of float32 router logits (no
  correction bias), renormalised where `norm_topk_prob` says, beside a gated shared expert every token takes
  (`shared_expert`, no gate of its own): GLM-4.5's routed block with one group (`models.glm4_moe`).
- The RMSNorms scale by their weight in float32 before the cast (GPT-OSS's: `cfg.norm_scale_first`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxinfer.config.model import LAYER_TYPES, ConfigError, ModelConfig, activation_name, common_fields
from jaxinfer.config.typed_windows import windows_by_type
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.glm4_moe import abstract_layer as glm4_moe_layer
from jaxinfer.models.glm4_moe import decoder_layer
from jaxinfer.models.glm4_moe import hf_leaves as glm4_moe_hf_leaves
from jaxinfer.models.mimo_v2_flash import DenseLayerWeights, MoELayerWeights
from jaxinfer.models.moe import is_dense
from jaxinfer.models.qwen3_moe import dense_mlp_layers
from jaxinfer.models.shared_expert import shared_expert_hf_leaves
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("FlintForCausalLM",)
# FlintConfig's defaults for the fields a config may leave out (or null).
DEFAULTS = dict(intermediate_size=6144, num_key_value_heads=4, head_dim=128, attention_bias=False,
                max_position_embeddings=262144, sliding_window=513, moe_intermediate_size=512,
                shared_expert_intermediate_size=1024, num_experts_per_tok=6, num_experts=256, norm_topk_prob=True,
                mlp_only_layers=[0, 1], decoder_sparse_step=1, tie_word_embeddings=False)


def default_layer_types(num_layers: int) -> list[str]:
    """FlintConfig's pattern: full for the first two layers, every fourth from layer 1 and the last; else sliding."""
    return ["full_attention" if i < 2 or i % 4 == 1 or i == num_layers - 1 else "sliding_attention"
            for i in range(num_layers)]


def abstract_layer(cfg: ModelConfig, layer: int) -> DenseLayerWeights | MoELayerWeights:
    """GLM-4.5's layer `layer` (dense or routed, no correction bias) with every head's sink logit."""
    base = glm4_moe_layer(cfg, layer)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    sinks = ArrayInfo((cfg.num_heads,), ("q_heads",))
    if is_dense(base):
        return DenseLayerWeights(**fields, sinks=sinks)
    return MoELayerWeights(**{**fields, "score_correction": None}, sinks=sinks)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """GLM-4.5's names but for the shared expert's (`shared_expert.`), no correction bias, and the sinks."""
    mlp = "model.layers.{i}.mlp."
    leaves = {name: leaf for name, leaf in glm4_moe_hf_leaves(cfg).items() if name != "score_correction"}
    return {
        **leaves,
        **shared_expert_hf_leaves(cfg, mlp, "shared_expert.", gated=False),
        "sinks": HFLeaf("model.layers.{i}.self_attn.softmax_offset", "same", (cfg.num_heads,)),
    }


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Flint HF config (FlintConfig's defaults where a key is absent or null)."""
    hf = {**DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    fields = common_fields(hf, arch)
    layers = fields["num_layers"]
    kinds = hf.get("layer_types") or default_layer_types(layers)
    if len(kinds) != layers or not set(kinds) <= set(LAYER_TYPES):
        raise ConfigError(f"layer_types {kinds!r} must give one of {list(LAYER_TYPES)} for each of the {layers} "
                          f"layers of {arch}")
    windows = windows_by_type(kinds, int(hf["sliding_window"]), arch)
    experts, per_token = int(hf["num_experts"]), int(hf["num_experts_per_tok"])
    if not 1 <= per_token <= experts:
        raise ConfigError(f"num_experts_per_tok {per_token} must be in [1, num_experts ({experts})] for {arch}")
    bias = bool(hf["attention_bias"])
    return ModelConfig(
        **fields,
        layer_windows=windows,
        nope_layers=tuple(i for i, kind in enumerate(kinds) if kind == "full_attention"),
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        norm_scale_first=True,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        num_experts=experts,
        experts_per_token=per_token,
        moe_intermediate_size=int(hf["moe_intermediate_size"]),
        norm_topk_prob=bool(hf["norm_topk_prob"]),
        shared_expert_intermediate_size=int(hf["shared_expert_intermediate_size"]),
        dense_layers=dense_mlp_layers(hf, layers),
    )


FAMILY = Family("flint", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
