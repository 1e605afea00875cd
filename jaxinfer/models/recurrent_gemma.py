"""Google RecurrentGemma (`RecurrentGemmaForCausalLM`: recurrentgemma-2b, -9b; Griffin): residual blocks whose
temporal mixer is, by `block_types` repeated over the layers, Griffin's recurrent block (models/rg_lru: an RG-LRU
after a short conv) or local attention, each followed by a gated MLP.

A layer is `hybrid.hybrid_layer`: RMSNorm (Gemma's, 1 + w, `temporal_pre_norm`), the mixer, the residual add, RMSNorm
(`channel_pre_norm`), the MLP (gate, up and down all biased; `intermediate_size` / 2 units, as transformers builds it,
so `ModelConfig.intermediate_size` holds the halved width), the residual add. Attention is sliding-window
(`attention_window_size` keys, the query's own included) multi-query attention with an o_proj bias, rotating the
leading `partial_rotary_factor` (0.5) of each head in halves (head_dim is hidden_size / num_attention_heads, as
transformers derives it over a stored one). The embeddings are scaled by sqrt(hidden_size) rounded to bfloat16 first
(transformers' `normalizer` buffer), and the logits soft-capped at `logits_soft_cap`. The recurrent layers are state
layers (`StateSpace.rg_lru`): slots, the fresh state at position 0, chunked prefill and preemption as Mamba's;
prefix caching and speculation off. `final_w_init_variance_scale` and `w_init_variance_scale` are training-only.
Refused by name: a rope type other than default (transformers refuses it too), an `lru_width` its heads do not
divide, block types other than recurrent / attention.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.glm import rotary_dim
from jaxinfer.models.hybrid import ATTENTION_FIELDS, hybrid_layer
from jaxinfer.models.layers import linear, linears
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.mlp import gate_product, mlp_hf_leaves, mlp_leaves
from jaxinfer.models.rg_lru import RecurrentFields, recurrent_hf_leaves, recurrent_leaves
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import attention_hf_leaves, attention_leaves
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("RecurrentGemmaForCausalLM",)
LAYER = "model.layers.{i}."
BLOCK_TYPES = ("recurrent", "attention")
# RecurrentGemmaConfig's defaults for fields a config leaves out (it has no max_position_embeddings: the recurrence
# and the local attention bound nothing; 8192 is the released models' training length)
DEFAULTS = dict(num_hidden_layers=26, vocab_size=256000, hidden_size=2560, intermediate_size=3 * 2560,
                num_attention_heads=10, attention_window_size=2048, conv1d_width=4, logits_soft_cap=30.0,
                rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", block_types=["recurrent", "recurrent",
                                                                                        "attention"],
                attention_bias=False, tie_word_embeddings=True, max_position_embeddings=8192)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class GriffinLayer(LayerWeights):
    """An attention layer: Llama's leaves, o_proj biased, and the MLP's biases (defaults only because the parent's
    fields have some: every layer sets them)."""

    b_gate: jax.Array | None = None  # [F]
    b_up: jax.Array | None = None  # [F]
    b_down: jax.Array | None = None  # [D]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class GriffinRecurrentLayer(RecurrentFields, GriffinLayer):
    """A recurrent layer: the attention fields None, the recurrent block's added."""

    PROJECTIONS: ClassVar[dict[str, int]] = {
        **{k: v for k, v in LayerWeights.PROJECTIONS.items() if k not in ATTENTION_FIELDS},
        **RecurrentFields.PROJECTIONS,
    }
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("w_gate", "w_up"), *RecurrentFields.JOINED)


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> GriffinLayer:
    """Layer `layer`'s leaves: its norms, biased MLP, and attention or the recurrent block."""
    D, F = cfg.hidden_size, cfg.intermediate_size
    norm = ArrayInfo((D,), ("embed",), init_value=0.0)
    biases = dict(b_gate=ArrayInfo((F,), ("mlp",)), b_up=ArrayInfo((F,), ("mlp",)), b_down=ArrayInfo((D,), ("embed",)))
    common = dict(attn_norm=norm, mlp_norm=norm, **mlp_leaves(D, F), **biases)
    if not cfg.is_state_layer(layer):
        return GriffinLayer(**common, **attention_leaves(cfg))
    return GriffinRecurrentLayer(**common, **{name: None for name in ATTENTION_FIELDS},
                                 **recurrent_leaves(cfg.state_space, D, cfg.num_heads))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives (each layer reads its own mixer's)."""
    D, F, mlp, block = cfg.hidden_size, cfg.intermediate_size, LAYER + "mlp_block.", LAYER + "temporal_block."
    return {
        "attn_norm": HFLeaf(LAYER + "temporal_pre_norm.weight", "same", (D,)),
        "mlp_norm": HFLeaf(LAYER + "channel_pre_norm.weight", "same", (D,)),
        **attention_hf_leaves(cfg, block),
        **recurrent_hf_leaves(cfg.state_space, D, cfg.num_heads, block),
        **mlp_hf_leaves(D, F, mlp),
        "b_gate": HFLeaf(mlp + "gate_proj.bias", "same", (F,)),
        "b_up": HFLeaf(mlp + "up_proj.bias", "same", (F,)),
        "b_down": HFLeaf(mlp + "down_proj.bias", "same", (D,)),
    }


def biased_mlp(cfg: ModelConfig, lw: GriffinLayer, h: jax.Array) -> jax.Array:
    """down(act(gate(h) + b_gate) * (up(h) + b_up)) + b_down."""
    g, u = linears(h, [lw.w_gate, lw.w_up])
    g, u = g + lw.b_gate.astype(g.dtype), u + lw.b_up.astype(u.dtype)
    return linear(gate_product(cfg.activation, g, u), lw.w_down) + lw.b_down.astype(h.dtype)


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: GriffinLayer, layer: int, positions: jax.Array, rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """The temporal mixer (the recurrent block or attention, by the layer's weights), then the biased MLP."""
    return hybrid_layer(cfg, x, cache, lw, layer, positions, rope, lambda h, _: biased_mlp(cfg, lw, h))


def block_kinds(hf: Mapping[str, Any], layers: int) -> tuple[str, ...]:
    """Each layer's block type: `block_types` repeated over the layers, as transformers reads it."""
    types = list(hf["block_types"])
    if not types or any(t not in BLOCK_TYPES for t in types):
        raise ConfigError(f"block_types {types} is not supported for RecurrentGemmaForCausalLM: give a non-empty list "
                          f"of {list(BLOCK_TYPES)}")
    return tuple((types * layers)[:layers])


def _checked(hf: Mapping[str, Any], arch: str) -> tuple[int, int]:
    """(head_dim, lru_width), refusing what is not run by name."""
    D, H = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    width = int(field(hf, "lru_width", None) or D)
    params = {**(hf.get("rope_parameters") or {}), **(hf.get("rope_scaling") or {})}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(f"rope type {rope_type!r} is not supported for {arch}; supported: default")
    if width % H:
        raise ConfigError(f"lru_width {width} is not supported for {arch}: its {H} gate blocks (num_attention_heads) "
                          "must divide it")
    return D // H, width


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a RecurrentGemma HF config (RecurrentGemmaConfig's defaults where a key is absent)."""
    hf = {**DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
    head_dim, width = _checked(hf, arch)
    layers = int(hf["num_hidden_layers"])
    fields = common_fields({**hf, "head_dim": head_dim, "intermediate_size": int(hf["intermediate_size"]) // 2}, arch)
    kinds = block_kinds(hf, layers)
    window = int(hf["attention_window_size"])
    # transformers' normalizer: sqrt(hidden_size) as a bfloat16 tensor, cast to the activations' dtype
    scale = float(jnp.asarray(np.sqrt(fields["hidden_size"]), jnp.bfloat16))
    return ModelConfig(
        **{**fields, "max_position_embeddings": int(hf["max_position_embeddings"]),
           "tie_word_embeddings": bool(hf["tie_word_embeddings"])},
        rotary_dim=rotary_dim(hf, head_dim),
        qkv_bias=bool(hf["attention_bias"]),
        o_bias=True,
        activation=activation_name(hf["hidden_activation"]),
        norm_weight_offset=1.0,
        embedding_multiplier=scale,
        layer_windows=tuple(window if kind == "attention" else 0 for kind in kinds),
        final_soft_cap=float(hf["logits_soft_cap"]),
        state_space=StateSpace.rg_lru(tuple(i for i, k in enumerate(kinds) if k == "recurrent"), width,
                                      int(hf["conv1d_width"])),
    )


FAMILY = Family("recurrent_gemma", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=("model.embed_tokens.weight", "model.final_norm.weight"))
