"""Zyphra Zamba (v1: `ZambaForCausalLM`, Zamba-7B-v1): Mamba-1 layers, some of them hybrid, each hybrid layer running
the one shared transformer block first.

Zamba2's layer (models/zamba2, `shared_block_layer`) over Mamba-1's selective mixer (models/mamba1_mixer): every
layer is x + mixer(norm(x)), a hybrid layer's mixer input x + linear(block(x, embeddings)), the block attention over
RMSNorm([x, input embeddings]) (heads of `attention_head_dim`, scores scaled by (head_dim / 2) ** -0.5, no rotary:
the mixers order the tokens), RMSNorm, then a gated MLP. Unlike Zamba2 there is one block, with no per-use adapters
(`SharedBlocks.adapter_rank` 0), stored under the first hybrid layer (transformers ties the others' to it) and
held there once (`zamba2.borrowed_leaves`). The mixer splits its channels into `n_mamba_heads` heads, each with its
own x_proj, dt_proj, B and C (`StateSpace.selective_heads`), its in_proj rows alternating x and the gate
(`StateSpace.interleaved_gate`). Refused by name: a `hidden_mamba_act` other than silu, an `attention_hidden_size`
other than 2 x hidden_size (the block's input is the two streams side by side).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.config.shared_blocks import SharedBlocks
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layer_calls import LayerInputs
from jaxinfer.models.mamba import time_step_rank
from jaxinfer.models.mamba1_mixer import SelectiveWeights, selective_hf_leaves, selective_leaves, selective_mixer
from jaxinfer.models.mlp import mlp_hf_leaves
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.zamba2 import (
    HYBRID,
    LAYER,
    SharedBlockFields,
    block_leaves,
    block_types,
    borrowed_leaves,
    shared_block_layer,
)
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("ZambaForCausalLM",)
# ZambaConfig's defaults for fields a config leaves out.
DEFAULTS = dict(mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank="auto", n_mamba_heads=2,
                mamba_conv_bias=True, mamba_proj_bias=False, hidden_act="gelu", hidden_mamba_act="silu",
                rms_norm_eps=1e-5, attn_layer_period=6, attn_layer_offset=4, max_position_embeddings=4096,
                tie_word_embeddings=True)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ZambaLayer(SharedBlockFields, SelectiveWeights):
    """A Mamba-1 layer, with a hybrid layer's use of the shared block. The per-head x_proj and dt_proj ([G, P, ...])
    stay unquantized: they are not [in, out] projections (and are small)."""

    PROJECTIONS: ClassVar[dict[str, int]] = {
        "in_proj": 1, "out_proj": 1, **SharedBlockFields.BLOCK_PROJECTIONS,
    }
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = SharedBlockFields.JOINED


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> ZambaLayer:
    """Layer `layer`'s leaves: the mixer's and its norm, and a hybrid layer's block use (and the block, in the
    first hybrid layer)."""
    D, blocks = cfg.hidden_size, cfg.shared_blocks
    block = block_leaves(cfg, blocks.stored_at(layer) == layer) if layer in blocks.layers else {}
    return ZambaLayer(**selective_leaves(cfg.state_space, D), mamba_norm=ArrayInfo((D,), ("embed",), init_value=1.0),
                      **block)


def _mamba_hf_leaves(cfg: ModelConfig, prefix: str) -> dict[str, HFLeaf]:
    """The mixer's and its norm's names under `prefix` (a Mamba layer's, or a hybrid layer's `mamba_decoder.`)."""
    return {"mamba_norm": HFLeaf(prefix + "input_layernorm.weight", "same", (cfg.hidden_size,)),
            **selective_hf_leaves(cfg.state_space, cfg.hidden_size, prefix + "mamba.")}


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where a Mamba layer's fields live (a hybrid layer's: `layer_hf_leaves`)."""
    return _mamba_hf_leaves(cfg, LAYER)


def _block_hf_leaves(cfg: ModelConfig, block: str) -> dict[str, HFLeaf]:
    """The shared block's tensors under `block` (`model.layers.{first hybrid}.shared_transf.`); q, k and v read
    [x, embeddings], 2D wide."""
    D, F, H, KV, K = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    E, attn = 2 * D, block + "self_attn."
    return {
        "attn_norm": HFLeaf(block + "input_layernorm.weight", "same", (E,)),
        "mlp_norm": HFLeaf(block + "pre_ff_layernorm.weight", "same", (D,)),
        "wq": HFLeaf(attn + "q_proj.weight", "in_heads", (H * K, E), H, K),
        "wk": HFLeaf(attn + "k_proj.weight", "in_heads", (KV * K, E), KV, K),
        "wv": HFLeaf(attn + "v_proj.weight", "in_heads", (KV * K, E), KV, K),
        "wo": HFLeaf(attn + "o_proj.weight", "out_heads", (D, H * K), H, K),
        **mlp_hf_leaves(D, F, block + "feed_forward."),
    }


def layer_hf_leaves(cfg: ModelConfig, layer: int) -> dict[str, HFLeaf]:
    """A hybrid layer's fields: its mixer under `mamba_decoder.`, the block where this layer holds it, its own
    `linear`; a Mamba layer's as `hf_leaves` gives them."""
    blocks = cfg.shared_blocks
    if layer not in blocks.layers:
        return {}
    own, D = LAYER.format(i=layer), cfg.hidden_size
    held = blocks.stored_at(layer) == layer
    return {
        **_mamba_hf_leaves(cfg, own + "mamba_decoder."),
        **(_block_hf_leaves(cfg, own + "shared_transf.") if held else {}),
        "block_out": HFLeaf(own + "linear.weight", "transpose", (D, D)),
    }


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: ZambaLayer, layer: int, positions: jax.Array, rope: RopeTables,
    inputs: LayerInputs,
) -> tuple[jax.Array, Any]:
    """A Zamba layer: Zamba2's `shared_block_layer` over Mamba-1's selective mixer."""
    return shared_block_layer(cfg, x, cache, lw, layer, positions, rope, inputs, selective_mixer)


def _types(hf: Mapping[str, Any], layers: int) -> tuple[str, ...]:
    """Each layer's type: `layers_block_type` where given, else ZambaConfig's pattern (layer 2, then every
    `attn_layer_period`-th from `attn_layer_offset` among the rest, hybrid)."""
    if field(hf, "layers_block_type", None) or field(hf, "layer_types", None):
        return block_types(hf, layers)
    period, offset = int(hf["attn_layer_period"]), int(hf["attn_layer_offset"])
    rest = [HYBRID if i % period == offset else "mamba" for i in range(layers - 3)]
    return block_types({"layers_block_type": (["mamba", "mamba", HYBRID] + rest)[:layers]}, layers)


def _refuse(hf: Mapping[str, Any], arch: str, hidden: int) -> None:
    """ConfigError naming the first setting not run."""
    if hf["hidden_mamba_act"] != "silu":
        raise ConfigError(f"hidden_mamba_act {hf['hidden_mamba_act']!r} is not supported for {arch}; supported: silu")
    wide = field(hf, "attention_hidden_size", None)
    if wide is not None and int(wide) != 2 * hidden:
        raise ConfigError(f"attention_hidden_size {wide} is not supported for {arch}; supported: 2 x hidden_size "
                          f"({2 * hidden}), the hidden state and the embeddings side by side")


def state_space(hf: Mapping[str, Any], layers: int, hidden: int) -> StateSpace:
    """Every layer's Mamba-1 mixer: mamba_expand x hidden_size channels in n_mamba_heads heads."""
    inner, heads = int(hf["mamba_expand"]) * hidden, int(hf["n_mamba_heads"])
    if heads < 1 or inner % heads:
        raise ConfigError(f"n_mamba_heads ({heads}) must divide mamba_expand x hidden_size ({inner})")
    ss = StateSpace.selective(tuple(range(layers)), inner, int(hf["mamba_d_state"]), int(hf["mamba_d_conv"]),
                              time_step_rank(hf["mamba_dt_rank"], hidden), bool(hf["mamba_conv_bias"]),
                              bool(hf["mamba_proj_bias"]))
    return dataclasses.replace(ss, selective_heads=heads, interleaved_gate=True)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Zamba HF config (ZambaConfig's defaults where a key is absent)."""
    hf = {**DEFAULTS, **hf}
    D, H, layers = int(hf["hidden_size"]), int(hf["num_attention_heads"]), int(hf["num_hidden_layers"])
    _refuse(hf, arch, D)
    head_dim = field(hf, "attention_head_dim", None) or field(hf, "head_dim", None) or 2 * D // H
    fields = common_fields({**hf, "head_dim": int(head_dim)}, arch)
    hybrid = tuple(i for i, t in enumerate(_types(hf, layers)) if t == HYBRID)
    return ModelConfig(
        **{**fields, "rms_norm_eps": float(hf["rms_norm_eps"]),
           "max_position_embeddings": int(hf["max_position_embeddings"]),
           "tie_word_embeddings": bool(hf["tie_word_embeddings"])},
        activation=activation_name(hf["hidden_act"]),
        attn_scale=(fields["head_dim"] / 2) ** -0.5,
        nope_layers=tuple(range(layers)),
        state_space=state_space(hf, layers, D),
        shared_blocks=SharedBlocks(layers=hybrid, num_blocks=1, adapter_rank=0, attention_adapters=False),
    )


FAMILY = Family("zamba", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=("model.embed_tokens.weight", "model.final_layernorm.weight"),
                layer_hf_leaves=layer_hf_leaves, reads_embeddings=True, borrowed_leaves=borrowed_leaves)
