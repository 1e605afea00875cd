"""IBM Granite with sliding-window layers (GraniteSWAForCausalLM, GraniteMoeSWAForCausalLM): Granite's and
Granite-MoE-Shared's layers (`models.granite`, `models.granite_moe`) with three attention changes.

As transformers' modular_granite_swa has it: `layer_types` marks each layer full or sliding over `sliding_window`
tokens (by default full every fourth layer from layer 0, 128 tokens); every head has a learned sink logit in its
softmax (GPT-OSS's: `self_attn.sinks`); `layer_rope_theta` gives each layer its rope base, 0 for none (NoPE). The
bases run as one for the full layers and one for the sliding ones (`cfg.local_rope_theta`, unscaled, so only with
the default rope type when they differ); other patterns are refused by name. The MoE model stores its experts as
transformers 5 writes them (`block_sparse_moe.experts.gate_up_proj` [E, 2F, D], `down_proj` [E, D, F], the router
at `block_sparse_moe.router.weight`), the shared MLP as Granite-MoE-Shared's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax

from jaxinfer.config.model import LAYER_TYPES, ConfigError, ModelConfig, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.granite import decoder_layer as granite_layer
from jaxinfer.models.granite import granite_fields
from jaxinfer.models.granite import hf_leaves as granite_hf_leaves
from jaxinfer.models.granite_moe import SharedMLPLayerWeights
from jaxinfer.models.granite_moe import abstract_layer as granite_moe_leaves
from jaxinfer.models.granite_moe import decoder_layer as granite_moe_layer
from jaxinfer.models.granite_moe import hf_leaves as granite_moe_hf_leaves
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.llama import abstract_layer as dense_leaves
from jaxinfer.models.mimo_v2_flash import DenseLayerWeights
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.moe import MoELayerWeights
from jaxinfer.parallel.array_info import ArrayInfo

DENSE, MOE = "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM"
ARCHITECTURES = (DENSE, MOE)
# The config classes' defaults for fields a config leaves out (or nulls) where ours differ.
DEFAULTS = {DENSE: dict(num_key_value_heads=4, max_position_embeddings=8192, rms_norm_eps=1e-5, bos_token_id=100257,
                        eos_token_id=100257, tie_word_embeddings=True),
            MOE: dict(bos_token_id=1, eos_token_id=2)}
HF_WINDOW = 128  # both configs' sliding_window default


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SinkMoELayerWeights(MoELayerWeights):
    """A Granite-MoE layer with every head's sink logit (None only because the parent's fields default)."""

    sinks: jax.Array | None = None  # [H]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SinkSharedMLPLayerWeights(SharedMLPLayerWeights):
    """A Granite-MoE-Shared layer (experts and the shared MLP) with every head's sink logit."""

    sinks: jax.Array | None = None  # [H]


SINK_CLASSES = {LayerWeights: DenseLayerWeights, MoELayerWeights: SinkMoELayerWeights,
                SharedMLPLayerWeights: SinkSharedMLPLayerWeights}


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> Any:
    """Granite's (dense) or Granite-MoE's layer leaves with a sink logit per head."""
    without_sinks = dataclasses.replace(cfg, attn_sinks=False)  # the parents' dataclasses have no sinks field
    base = granite_moe_leaves(without_sinks, layer) if cfg.num_experts else dense_leaves(without_sinks, layer)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return SINK_CLASSES[type(base)](**fields, sinks=ArrayInfo((cfg.num_heads,), ("q_heads",)))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Granite's names (sinks at `self_attn.sinks`), or Granite-MoE's with transformers 5's expert and router names."""
    if not cfg.num_experts:
        return granite_hf_leaves(cfg)
    D, E, F = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    moe = "model.layers.{i}.block_sparse_moe."
    experts = (moe + "experts.gate_up_proj", "transpose", (E, 2 * F, D))
    return {
        **granite_moe_hf_leaves(cfg),
        "router": HFLeaf(moe + "router.weight", "transpose", (E, D)),
        "moe_gate": HFLeaf(*experts),
        "moe_up": HFLeaf(*experts, row_offset=F),
        "moe_down": HFLeaf(moe + "experts.down_proj", "transpose", (E, D, F)),
    }


def decoder_layer(cfg: ModelConfig, x, cache, lw, layer: int, positions, rope):
    """Granite-MoE's layer where the model has experts, Granite's otherwise (self_attention reads `lw.sinks`)."""
    fn = granite_moe_layer if cfg.num_experts else granite_layer
    return fn(cfg, x, cache, lw, layer, positions, rope)


def layer_kinds(hf: Mapping[str, Any], arch: str, num_layers: int) -> list[str]:
    """`layer_types`, or the configs' default: full every fourth layer from layer 0, sliding otherwise."""
    kinds = hf.get("layer_types") or ["full_attention" if i % 4 == 0 else "sliding_attention"
                                      for i in range(num_layers)]
    if len(kinds) != num_layers or not set(kinds) <= set(LAYER_TYPES):
        raise ConfigError(f"layer_types {kinds!r} must give one of {list(LAYER_TYPES)} for each of the {num_layers} "
                          f"layers of {arch}")
    return kinds


def rope_fields(hf: Mapping[str, Any], arch: str, kinds: list[str], fields: Mapping[str, Any]) -> dict[str, Any]:
    """rope_theta, local_rope_theta and nope_layers from `layer_rope_theta` (None: the global base everywhere)."""
    thetas = hf.get("layer_rope_theta") or [fields["rope_theta"]] * len(kinds)
    if len(thetas) != len(kinds) or any(isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0
                                        for t in thetas):
        raise ConfigError(f"layer_rope_theta {thetas!r} must give a base >= 0 (0: no rope) for each of the "
                          f"{len(kinds)} layers of {arch}")
    by_kind = {kind: {float(t) for t, k in zip(thetas, kinds) if t and k == kind} for kind in LAYER_TYPES}
    full, sliding = by_kind["full_attention"], by_kind["sliding_attention"]
    if len(full) > 1 or len(sliding) > 1:
        raise ConfigError(f"layer_rope_theta {thetas!r} is not supported for {arch}: one base for the full layers "
                          "and one for the sliding ones (or 0) only")
    local = sliding.pop() if full and sliding and full != sliding else None
    if local is not None and fields["rope_scaling"].rope_type != "default":
        raise ConfigError(f"layer_rope_theta {thetas!r} is not supported for {arch} with rope type "
                          f"{fields['rope_scaling'].rope_type!r}: the sliding layers' own base runs unscaled, so "
                          "only with the default rope type")
    theta = next(iter(full or sliding), fields["rope_theta"])
    return dict(rope_theta=theta, local_rope_theta=local, nope_layers=tuple(i for i, t in enumerate(thetas) if not t))


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a GraniteSWA or GraniteMoeSWA HF config (fields left out take their config class's defaults)."""
    window = hf.get("sliding_window", HF_WINDOW)
    hf = {**DEFAULTS[arch], **{k: v for k, v in hf.items() if v is not None}}
    fields = granite_fields({**hf, "layer_types": None}, arch)  # the windows are read below
    kinds = layer_kinds(hf, arch, fields["num_layers"])
    if "sliding_attention" in kinds and (window is None or int(window) < 1):
        raise ConfigError(f"sliding_window {window!r} is not supported for {arch}'s sliding layers: >= 1 only")
    fields.update(layer_windows=tuple(int(window) if kind == "sliding_attention" else 0 for kind in kinds),
                  attn_sinks=True, **rope_fields(hf, arch, kinds, fields))
    if arch == DENSE:
        return ModelConfig(**fields)
    shared = int(field(hf, "shared_intermediate_size", 0))
    if shared < 0:
        raise ConfigError(f"shared_intermediate_size {shared} must be >= 0 for {arch} (0: no shared MLP)")
    return ModelConfig(**fields, shared_expert_intermediate_size=shared,
                       **moe_fields(hf, "num_local_experts", fields["intermediate_size"]))


FAMILY = Family("granite_swa", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
