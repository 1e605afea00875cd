"""Sapient HRM-Text (`HrmTextForCausalLM`): a hierarchical recurrent model, two stacks of Llama layers run in cycles.

As transformers' modular_hrm_text has it:

- Two stacks of `num_layers_per_stack` pre-norm Llama layers, L and H, each ending in a norm; every norm is an
  RMSNorm without a weight (NanoChat's: `cfg.weightless_norms`). Attention is multi-head (no grouped K/V), its
  output times sigmoid(gate_proj(h)) per head and dim before o_proj (`attn_gate`).
- Two states: high starts as the embeddings times `embedding_scale` (1 / initializer_range by default), low as the
  learned `z_L_init`. Each of `H_cycles` cycles runs the L stack `L_cycles` times on low + high (its output the new
  low), then the H stack on high + low (the new high); the last high is the final hidden state (no final norm
  beyond the H stack's).
- The cycles are unrolled (config/hrm_cycles): each stack run's layers are decoder layers with their own pages, as
  transformers' cache slots are; the runs after each stack's first borrow its weights (`borrowed_leaves`, with the
  layer's place in its run: `placed_layer`), and the two states ride between layers as `HrmStates`.
- Checkpoints store each layer's gate, q, k and v in one `attn.gqkv_proj` and its gate and up in `mlp.gate_up_proj`
  (transformers splits them at load; here each leaf reads its rows).

`prefix_lm` makes the tokens marked by `token_type_ids` attend both ways; transformers does so only when it is given
token types, which a prompt here does not carry: prompts run causally, as transformers runs them without token
types. `attention_bias` (a bias on the fused projection, no release sets it) is refused by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.hrm_cycles import HrmCycles
from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import Weight
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.llama import decoder_layer as llama_layer
from jaxinfer.models.mlp import mlp_leaves
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.placed_layer import PlacedLayer, placed
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import attention_leaves
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("HrmTextForCausalLM",)
STACKS = ("model.L_module.layers.", "model.H_module.layers.")
# HrmTextConfig's defaults for the fields a config may leave out (or null) where ours differ.
DEFAULTS = dict(vocab_size=151808, hidden_size=1536, intermediate_size=4096, num_hidden_layers=16,
                num_attention_heads=12, head_dim=128, max_position_embeddings=2048, initializer_range=0.02,
                rms_norm_eps=1e-6, H_cycles=2, L_cycles=3, attention_bias=False)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class HrmLayer(LayerWeights):
    """Llama's leaves without norm weights, with the output gate (and, in decoder layer 0, low's first value)."""

    attn_gate: Weight | None = None  # [D, H, K]
    low_init: jax.Array | None = None  # [D] z_L_init

    PROJECTIONS: ClassVar[dict[str, int]] = {**LayerWeights.PROJECTIONS, "attn_gate": 1}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class HrmStates:
    """What a layer hands the next: the two states and the stream of the stack run under way."""

    high: jax.Array  # [B, T, D]
    low: jax.Array  # [B, T, D]
    hidden: jax.Array  # [B, T, D]


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> HrmLayer:
    """Layer `layer`'s leaves where it holds its weights (its stack's first run), none where it borrows them."""
    cycles = cfg.hrm_cycles
    if cycles.holder(layer) != layer:
        return HrmLayer(None, None, None, None, None, None, None, None, None)
    D, H, K = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    return HrmLayer(attn_norm=None, mlp_norm=None, **attention_leaves(cfg), **mlp_leaves(D, cfg.intermediate_size),
                    attn_gate=ArrayInfo((D, H, K), ("embed", "q_heads", "head_dim")),
                    low_init=ArrayInfo((D,), ("embed",)) if layer == 0 else None)


def _stack_leaves(cfg: ModelConfig, prefix: str) -> dict[str, HFLeaf]:
    """One stack layer's fields under `prefix` (`{i}` its index): the fused gate/q/k/v and gate/up rows."""
    D, F, H, K = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.head_dim
    gqkv = (prefix + "{i}.attn.gqkv_proj.weight", "in_heads", (4 * H * K, D), H, K)
    gate_up = (prefix + "{i}.mlp.gate_up_proj.weight", "transpose", (2 * F, D))
    return {
        "attn_gate": HFLeaf(*gqkv),
        "wq": HFLeaf(*gqkv, row_offset=H * K),
        "wk": HFLeaf(*gqkv, row_offset=2 * H * K),
        "wv": HFLeaf(*gqkv, row_offset=3 * H * K),
        "wo": HFLeaf(prefix + "{i}.attn.o_proj.weight", "out_heads", (D, H * K), H, K),
        "w_gate": HFLeaf(*gate_up),
        "w_up": HFLeaf(*gate_up, row_offset=F),
        "w_down": HFLeaf(prefix + "{i}.mlp.down_proj.weight", "transpose", (D, F)),
    }


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """The L stack's names (its first run's decoder layers are its layers' indices) and low's first value."""
    return {**_stack_leaves(cfg, STACKS[0]), "low_init": HFLeaf("model.z_L_init", "same", (cfg.hidden_size,))}


def layer_hf_leaves(cfg: ModelConfig, layer: int) -> dict[str, HFLeaf]:
    """The H stack's first run's layers: the H stack's names at the layer's index in it."""
    cycles = cfg.hrm_cycles
    if not cycles.in_high(layer) or cycles.holder(layer) != layer:
        return {}
    j = str(cycles.stored(layer))
    return {name: dataclasses.replace(leaf, name=leaf.name.replace("{i}", j))
            for name, leaf in _stack_leaves(cfg, STACKS[1]).items()}


def borrowed_leaves(cfg: ModelConfig, layers: list[HrmLayer], layer: int) -> PlacedLayer:
    """Layer `layer`'s stack layer's weights with its place in its stack run."""
    cycles = cfg.hrm_cycles
    return placed(layers[cycles.holder(layer)], start=cycles.starts_run(layer), end=cycles.ends_run(layer),
                  high=cycles.in_high(layer), last=layer == cycles.num_layers - 1)


def decoder_layer(
    cfg: ModelConfig, x: jax.Array | HrmStates, cache: Any, place: PlacedLayer, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array | HrmStates, Any]:
    """Llama's layer on the run's stream; a run starts from low + high and ends by norming its stream into its
    stack's state (the last run's, high, is the decoder's output)."""
    lw = place.weights
    if isinstance(x, jax.Array):  # decoder layer 0: the scaled embeddings are high, z_L_init low
        x = HrmStates(x, jnp.broadcast_to(lw.low_init.astype(x.dtype), x.shape), x)
    hidden = x.low + x.high if place.at("start") else x.hidden
    hidden, cache = llama_layer(cfg, hidden, cache, lw, layer, positions, rope)
    if not place.at("end"):
        return HrmStates(x.high, x.low, hidden), cache
    state = rms_norm(hidden, None, cfg.rms_norm_eps)
    if place.at("last"):
        return state, cache
    return (HrmStates(state, x.low, state) if place.at("high") else HrmStates(x.high, state, state)), cache


def hrm_cycles(hf: Mapping[str, Any]) -> HrmCycles:
    """The stacks and cycles; `num_hidden_layers` is the stack depth where `num_layers_per_stack` is absent (a
    config transformers has not yet inflated), else their product with the runs."""
    stack = field(hf, "num_layers_per_stack", hf["num_hidden_layers"])
    cycles = HrmCycles(int(stack), int(hf["H_cycles"]), int(hf["L_cycles"]))
    if hf.get("num_layers_per_stack") is not None and int(hf["num_hidden_layers"]) != cycles.num_layers:
        raise ConfigError(f"num_hidden_layers {hf['num_hidden_layers']} must be num_layers_per_stack x H_cycles x "
                          f"(L_cycles + 1) = {cycles.num_layers} (one per stack layer run)")
    return cycles


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an HRM-Text HF config, its cycles unrolled (fields it leaves out or nulls take
    HrmTextConfig's defaults)."""
    hf = {**DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    if hf["attention_bias"]:
        raise ConfigError(f"attention_bias=True is not supported for {arch} (a bias on its fused gate/q/k/v "
                          "projection; no release sets it)")
    cycles = hrm_cycles(hf)
    fields = common_fields({**hf, "num_key_value_heads": hf["num_attention_heads"]}, arch)  # multi-head attention
    scale = field(hf, "embedding_scale", 1.0 / float(hf["initializer_range"]))
    return ModelConfig(
        **{**fields, "num_layers": cycles.num_layers},
        weightless_norms=True, final_norm=False, embedding_multiplier=float(scale),
        activation=activation_name(hf.get("hidden_act") or "silu"), hrm_cycles=cycles,
    )


FAMILY = Family("hrm_text", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                layer_hf_leaves=layer_hf_leaves, borrowed_leaves=borrowed_leaves)
