"""The decoder every family shares: the weights tree, embedding, the layer loop and the output head.

Each layer owns its weight buffers and the layers are unrolled: a `lax.scan` over stacked
weights makes XLA copy every layer's slice before its matmuls, which costs a third of decode
speed on CPU. Each is called through `layer_calls`, so layers alike are traced once. The layer
itself is the family's (`models.registry`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.embed_override import EmbedOverride, add_deepstack, override_embeddings, placeholders_as
from jaxinfer.models.layer_calls import LayerInputs, call_layer
from jaxinfer.models.layers import Weight, linear, linear_transposed
from jaxinfer.models.norms import config_norm, rms_norm
from jaxinfer.models.registry import family_of
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.row_table import RowTable, take_rows
from jaxinfer.models.self_attention import HIDDEN
from jaxinfer.parallel.array_info import ArrayInfo


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Weights:
    """All weights of one model; `lm_head` is None when tied to the embedding (packed trees aside).

    logit_soft_cap (static): the output logits pass through cap * tanh(logits / cap) (Gemma 2).
    logits_scaling (static): the output logits are divided by it (Granite).
    """

    embed: jax.Array | RowTable  # [V, E] (E: cfg.embedding_size); a RowTable only in the CPU kernels' tree
    layers: list[Any]  # one family layer dataclass per layer
    final_norm: jax.Array | None  # [D]; None: OLMo 1's weightless LayerNorm, or none (OPT-350M's cfg.post_norm,
    # Qwen4-Exp's cfg.final_norm false)
    lm_head: Weight | None = None  # [E, V]
    final_norm_bias: jax.Array | None = None  # [D]: StarCoder2's, Nemotron's final LayerNorm bias
    lm_head_bias: jax.Array | None = None  # [V]: Phi's output head bias
    logit_scale: jax.Array | None = None  # [V]: Dory's learned scale of each token's logit
    position_embed: jax.Array | None = None  # [P, D]: GPT-2's learned positions, a row per position (OPT: from row 2)
    project_in: jax.Array | None = None  # [E, D]: OPT-350M's embeddings into the layers' width
    project_out: jax.Array | None = None  # [D, E]: and the final hidden states back to the embeddings' (the head's)
    logit_soft_cap: float | None = dataclasses.field(default=None, metadata=dict(static=True))
    logits_scaling: float = dataclasses.field(default=1.0, metadata=dict(static=True))


def abstract_weights(cfg: ModelConfig) -> Weights:
    """Every weight leaf as an ArrayInfo; init, loading and sharding derive from this tree."""
    D, V, E = cfg.hidden_size, cfg.vocab_size, cfg.embedding_size
    norm = 0.0 if cfg.norm_weight_offset else 1.0
    family = family_of(cfg)
    final_norm = not cfg.post_norm and cfg.final_norm
    projected = E != D
    return Weights(
        embed=ArrayInfo((V, E), ("vocab", "embed")),
        layers=[family.abstract_layer(cfg, i) for i in range(cfg.num_layers)],
        final_norm=None if cfg.weightless_norms or not final_norm else ArrayInfo((D,), ("embed",), init_value=norm),
        lm_head=None if cfg.tie_word_embeddings else ArrayInfo((E, V), ("embed", "vocab")),
        final_norm_bias=ArrayInfo((D,), ("embed",)) if cfg.norm_bias and final_norm else None,
        lm_head_bias=ArrayInfo((V,), ("vocab",)) if cfg.lm_head_bias else None,
        logit_scale=ArrayInfo((V,), ("vocab",), init_value=1.0) if cfg.logit_scale else None,
        position_embed=ArrayInfo((position_rows(cfg), D), (None, "embed")) if cfg.learned_positions else None,
        project_in=ArrayInfo((E, D), (None, "embed")) if projected else None,
        project_out=ArrayInfo((D, E), ("embed", None)) if projected else None,
        logit_soft_cap=cfg.final_soft_cap,
        logits_scaling=cfg.logits_scaling,
    )


def embed_tokens(weights: Weights, tokens: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Token embeddings [B, T, D]; Gemma scales them by sqrt(D) in the weight dtype, as HF does, Granite
    by its embedding_multiplier in float32, rounded once (as torch multiplies a 16-bit tensor by a Python float),
    and NanoChat RMS-norms them without a weight (`cfg.embed_norm`)."""
    x = take_rows(weights.embed, tokens)
    if cfg.scale_embeddings:
        x = x * jnp.asarray(math.sqrt(cfg.hidden_size), dtype=x.dtype)
    if cfg.embedding_multiplier != 1.0:
        x = (x.astype(jnp.float32) * cfg.embedding_multiplier).astype(x.dtype)
    return rms_norm(x, None, cfg.rms_norm_eps) if cfg.embed_norm else x


def position_rows(cfg: ModelConfig) -> int:
    """Rows of the learned position table: one per position, after OPT's `position_offset` unused ones."""
    return cfg.max_position_embeddings + cfg.position_offset


def add_positions(x: jax.Array, table: jax.Array | None, positions: jax.Array, offset: int = 0) -> jax.Array:
    """x [B, T, D] plus each token's row of a learned position table [P, D] (GPT-2; OPT's from row `offset`),
    gathered: positions are data. Padding (position -1) reads row `offset`; no request reaches past the table
    (max_seq_len <= max_position_embeddings, checked at load)."""
    if table is None:
        return x
    return x + jnp.take(table, jnp.maximum(positions, 0) + offset, axis=0).astype(x.dtype)


def forward(weights: Weights, tokens: jax.Array, positions: jax.Array, cache: Any, cfg: ModelConfig) -> tuple[jax.Array, Any]:
    """Run the decoder on tokens [B, T] at positions [B, T]; returns final hidden [B, T, D] and cache."""
    hidden, _, cache = forward_with_taps(weights, tokens, positions, cache, cfg, ())
    return hidden, cache


def forward_with_taps(
    weights: Weights, tokens: jax.Array, positions: jax.Array, cache: Any, cfg: ModelConfig, taps: tuple[int, ...],
    override: EmbedOverride | None = None, streams: jax.Array | None = None,
) -> tuple[jax.Array, list[jax.Array], Any]:
    """`forward`, also returning the residual stream [B, T, D] entering each layer in `taps` (EAGLE-3 reads them;
    tap num_layers is the stream leaving the last layer, before the final norm: what an MTP layer reads);
    override: rows replacing some tokens' embeddings (a vision-language model's image features), and rows added
    to their hidden states after the first layers (Qwen3-VL's DeepStack); streams
    [3, B, T]: M-RoPE's rotary positions where they differ from `positions` (Qwen2-VL's image tokens)."""
    if taps and (cfg.hyper_connections is not None or cfg.qwen4_exp is not None):  # Qwen4-Exp's: gated_residual
        raise ValueError(f"hidden-state taps (EAGLE-3 heads, MTP drafts) are not supported for {cfg.architecture}: "
                         "its residual is several hyper-connection streams, not the one stream a head reads")
    if taps and cfg.looped is not None:
        raise ValueError(f"hidden-state taps (EAGLE-3 heads, MTP drafts) are not supported for {cfg.architecture}: "
                         "its layers run in loops, so a layer's index names no one point of the stream")
    x = override_embeddings(embed_tokens(weights, tokens, cfg), override)
    if weights.project_in is not None:
        x = linear(x, weights.project_in)
    x = add_positions(x, weights.position_embed, positions, cfg.position_offset)
    x = cache.layout.constrain(x, HIDDEN)
    rope = RopeTables(positions, cfg, streams)
    family = family_of(cfg)
    layer_fn = family.layer
    # Gemma 4's per-layer inputs read them (an image token as the pad token), Qwen4-Exp's n-gram embeddings too;
    # Zamba2's shared blocks read the input embeddings
    reads_tokens = cfg.per_layer_input_size or cfg.qwen4_exp is not None or family.reads_embeddings
    inputs = LayerInputs(placeholders_as(tokens, override, cfg.pad_token_id), x) if reads_tokens else None
    tapped = []
    for layer, lw in enumerate(weights.layers):
        if family.borrowed_leaves is not None:  # traced references, so a shared leaf stays one buffer
            lw = family.borrowed_leaves(cfg, weights.layers, layer)
        if layer in taps:
            tapped.append(x)
        x, cache = call_layer(layer_fn, cfg, x, cache, lw, layer, positions, rope, inputs)
        x = add_deepstack(x, override, layer)
    if len(weights.layers) in taps:
        tapped.append(x)
    return final_hidden(weights, x, cfg), tapped, cache


def final_hidden(weights: Weights, x: jax.Array, cfg: ModelConfig) -> jax.Array:
    """The last layer's output [B, T, D] normed (but after OPT-350M's post-norm layers) and projected to the embeddings'
    width [B, T, E] where OPT-350M's project_out says."""
    if not cfg.post_norm and cfg.final_norm:
        x = config_norm(x, weights.final_norm, weights.final_norm_bias, cfg)
    return x if weights.project_out is None else linear(x, weights.project_out)


def lm_logits(weights: Weights, hidden: jax.Array) -> jax.Array:
    """Float32 next-token logits [..., V] from final hidden states [..., D] (biased, scaled per token (Dory) and
    overall, and soft-capped where the model says)."""
    if weights.lm_head is None:
        logits = linear_transposed(hidden, weights.embed)
    else:
        logits = linear(hidden, weights.lm_head, out_dtype=jnp.float32)
    if weights.logit_scale is not None:
        logits = logits * weights.logit_scale.astype(jnp.float32)
    return finish_logits(logits, weights.lm_head_bias, weights.logits_scaling, weights.logit_soft_cap)


def finish_logits(logits: jax.Array, bias: jax.Array | None, scaling: float, soft_cap: float | None) -> jax.Array:
    """The output head's bias, scaling and soft cap on its float32 product [..., V], where the model has them
    (a draft reading the target's head applies them too, so it drafts from the target's scale)."""
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    if scaling != 1.0:
        logits = logits / scaling
    return logits if soft_cap is None else soft_cap * jnp.tanh(logits / soft_cap)
