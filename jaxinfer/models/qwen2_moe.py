"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): the Qwen2 layer with routed experts and a shared expert.

Attention has q/k/v biases (`qkv_bias`, default true) and no o bias or q/k norms. Routing is
Qwen3-MoE's (softmax, top k, renormalised only with `norm_topk_prob`), and so are the dense layers
(`mlp_only_layers`, `decoder_sparse_step`) and the checkpoint names; every MoE layer adds the gated
shared expert of `models.shared_expert`.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, layer_types
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.llama import abstract_layer as dense_leaves
from jaxinfer.models.llama import decoder_layer as dense_layer
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.moe import is_dense
from jaxinfer.models.qwen3_moe import dense_mlp_layers
from jaxinfer.models.qwen3_moe import hf_leaves as qwen3_moe_hf_leaves
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.shared_expert import abstract_shared_moe_layer, shared_expert_hf_leaves, shared_moe_decoder_layer

ARCHITECTURES = ("Qwen2MoeForCausalLM",)
# transformers' defaults for the fields a config may leave out (or null) that this family reads itself.
HF_DEFAULTS = dict(num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408,
                   shared_expert_intermediate_size=5632, qkv_bias=True, max_window_layers=28, sliding_window=4096)


def abstract_layer(cfg: ModelConfig, layer: int) -> Any:
    """One layer's leaves as ArrayInfos: routed and shared experts, or a dense MLP in `dense_layers`."""
    return abstract_shared_moe_layer(cfg) if cfg.is_moe_layer(layer) else dense_leaves(cfg, layer)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Qwen3-MoE's names (norms, router, attention, dense MLP, experts) and the shared expert's."""
    return {**qwen3_moe_hf_leaves(cfg), **shared_expert_hf_leaves(cfg, "model.layers.{i}.mlp.")}


def decoder_layer(cfg: ModelConfig, x, cache, lw, layer: int, positions, rope: RopeTables):
    """The MoE layer with its shared expert, or the Qwen2 layer where the MLP is dense."""
    fn = dense_layer if is_dense(lw) else shared_moe_decoder_layer
    return fn(cfg, x, cache, lw, layer, positions, rope)


def _layer_windows(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """Sliding window per layer as transformers 5 reads it: `layer_types`, else with `use_sliding_window`
    the even layers below `max_window_layers` (not Qwen2's layers from it on); 0 = full attention.

    transformers zeroes `sliding_window` without `use_sliding_window`, and fails on a sliding layer then.
    `hf` has `HF_DEFAULTS` filled in.
    """
    sliding = bool(hf.get("use_sliding_window"))
    window = int(hf["sliding_window"]) if sliding else 0
    types = layer_types(hf, num_layers)
    if types is None:
        below = int(hf["max_window_layers"])
        types = ["sliding_attention" if sliding and i % 2 == 0 and i < below else "full_attention"
                 for i in range(num_layers)]
    if "sliding_attention" in types and not window:
        raise ConfigError(f"layer_types {types!r} has sliding layers but no window (use_sliding_window "
                          f"{hf.get('use_sliding_window')!r}, sliding_window {hf.get('sliding_window')!r}); "
                          "set both or make every layer full_attention")
    return tuple(window if t == "sliding_attention" else 0 for t in types)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Qwen2-MoE HF config."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    fields = common_fields(hf, arch)
    shared = int(hf["shared_expert_intermediate_size"])
    if shared < 1:
        raise ConfigError(f"shared_expert_intermediate_size {shared} must be >= 1 (each MoE layer has a shared expert)")
    return ModelConfig(
        **fields,
        qkv_bias=bool(hf["qkv_bias"]),
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=_layer_windows(hf, fields["num_layers"]),
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        dense_layers=dense_mlp_layers(hf, fields["num_layers"]),
        shared_expert_intermediate_size=shared,
        **moe_fields(hf, "num_experts", int(hf["moe_intermediate_size"])),
    )


FAMILY = Family("qwen2_moe", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
