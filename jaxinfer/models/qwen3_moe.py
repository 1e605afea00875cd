"""Qwen3-MoE: the Qwen3 layer (q/k norms) with routed experts (`models.moe`).

Routing renormalises the chosen experts' weights only with `norm_topk_prob`. Layers listed in
`mlp_only_layers`, or off the `decoder_sparse_step` stride, keep a dense MLP of
`intermediate_size`; the experts have `moe_intermediate_size` hidden units. Qwen3-VL-MoE's language model
(`FUSED`) stores each layer's experts in two tensors, as the hub's checkpoints hold them: gate_up_proj
[E, D, 2F] (gate columns, then up) and down_proj [E, F, D].
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.llama import abstract_layer as dense_leaves
from jaxinfer.models.llama import decoder_layer as dense_layer
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.mlp import mlp_hf_leaves
from jaxinfer.models.moe import abstract_moe_layer, experts_hf_leaves, is_dense, moe_decoder_layer
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import attention_hf_leaves

FUSED = "Qwen3VLMoeTextForCausalLM"  # Qwen3-VL-MoE's language model (models/qwen2_vl), its experts fused
ARCHITECTURES = ("Qwen3MoeForCausalLM", FUSED)


def abstract_layer(cfg: ModelConfig, layer: int) -> Any:
    """One layer's leaves as ArrayInfos: routed experts, or a dense MLP in `dense_layers`."""
    return abstract_moe_layer(cfg) if cfg.is_moe_layer(layer) else dense_leaves(cfg, layer)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives (the dense MLP's fields only in dense layers, the experts' in the others)."""
    D, E, mlp = cfg.hidden_size, cfg.num_experts, "model.layers.{i}.mlp."
    return {
        "attn_norm": HFLeaf("model.layers.{i}.input_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf("model.layers.{i}.post_attention_layernorm.weight", "same", (D,)),
        "router": HFLeaf(mlp + "gate.weight", "transpose", (E, D)),
        **attention_hf_leaves(cfg),
        **mlp_hf_leaves(D, cfg.intermediate_size),
        **(fused_experts_hf_leaves(cfg, mlp + "experts.") if cfg.architecture == FUSED else
           experts_hf_leaves(cfg, mlp + "experts.", ("gate_proj", "up_proj", "down_proj"))),
    }


def fused_experts_hf_leaves(cfg: ModelConfig, prefix: str) -> dict[str, HFLeaf]:
    """The experts as two stored tensors: gate_up_proj [E, D, 2F] (gate columns first) and down_proj [E, F, D]."""
    D, E, F = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    return {
        "moe_gate": HFLeaf(prefix + "gate_up_proj", "columns", (E, D, 2 * F)),
        "moe_up": HFLeaf(prefix + "gate_up_proj", "columns", (E, D, 2 * F), row_offset=F),
        "moe_down": HFLeaf(prefix + "down_proj", "same", (E, F, D)),
    }


def decoder_layer(cfg: ModelConfig, x, cache, lw, layer: int, positions, rope: RopeTables):
    """The MoE layer, or the Qwen3 layer where the MLP is dense."""
    fn = dense_layer if is_dense(lw) else moe_decoder_layer
    return fn(cfg, x, cache, lw, layer, positions, rope)


def dense_mlp_layers(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """Layers transformers builds with a dense MLP: listed in mlp_only_layers or off the sparse step."""
    step = int(field(hf, "decoder_sparse_step", 1))
    if step < 1:
        raise ConfigError(f"decoder_sparse_step {step} must be >= 1 (every step-th layer has experts)")
    listed = set(field(hf, "mlp_only_layers", []))
    return tuple(i for i in range(num_layers) if i in listed or (i + 1) % step)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Qwen3-MoE HF config (a sliding window, when used, applies to every layer)."""
    fields = common_fields(hf, arch)
    window = int(field(hf, "sliding_window", 0)) if hf.get("use_sliding_window") else 0
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        **fields,
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows({}, arch, fields["num_layers"], window),
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        dense_layers=dense_mlp_layers(hf, fields["num_layers"]),
        # transformers' Qwen3MoeConfig defaults: 128 experts, 8 per token, 768 hidden units each.
        **moe_fields(hf, "num_experts", int(field(hf, "moe_intermediate_size", 768)), experts=128, per_token=8),
    )


FAMILY = Family("qwen3_moe", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
