"""The encoder of BERT, RoBERTa and XLM-RoBERTa as pure functions over its weight tree: word + absolute
position + token-type embeddings and their LayerNorm, then post-LN layers (bidirectional attention over
each row's real tokens, a GELU MLP), as HF's `BertModel` / `XLMRobertaModel` compute `last_hidden_state`.

Rows are right-padded: row b's first lengths[b] tokens are real, and no real token attends to padding.
Token types travel in the ids (vLLM's encoding): bit TYPE_SHIFT set marks a type-1 token (a BERT
cross-encoder's second text), so the pass takes no input a decoder's does not.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.kernels.precision import matmul_precision
from jaxinfer.models.encoder_config import EncoderConfig

TYPE_SHIFT = 30  # ids stay below 2**30; the bit above carries the token type


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Dense:
    """A torch Linear as [in, out] and its bias [out]."""

    weight: jax.Array
    bias: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Norm:
    """A LayerNorm's scale and bias [D]."""

    weight: jax.Array
    bias: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class EncoderLayer:
    """One post-LN layer: attention (query, key, value, output [D, D]) and its norm, the MLP and its norm."""

    query: Dense
    key: Dense
    value: Dense
    attn_out: Dense
    attn_norm: Norm
    mlp_in: Dense  # [D, F]
    mlp_out: Dense  # [F, D]
    mlp_norm: Norm


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class EncoderWeights:
    """All of an encoder's weights; `config` is static (part of the tree's structure, as a jit key)."""

    words: jax.Array  # [V, D]
    positions: jax.Array  # [max_position_embeddings, D]
    types: jax.Array  # [type_vocab_size, D]
    embed_norm: Norm
    layers: list[EncoderLayer]
    config: EncoderConfig = dataclasses.field(metadata=dict(static=True))


def split_types(tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(ids, token types) of tokens [B, T] that carry their type in bit TYPE_SHIFT."""
    return tokens & ((1 << TYPE_SHIFT) - 1), tokens >> TYPE_SHIFT


def position_ids(cfg: EncoderConfig, ids: jax.Array) -> jax.Array:
    """Position rows [B, T]: 0, 1, ... (BERT); RoBERTa's count non-pad tokens from pad + 1, pad tokens at pad."""
    if cfg.layout == "bert":
        return jnp.broadcast_to(jnp.arange(ids.shape[1], dtype=jnp.int32), ids.shape)
    real = (ids != cfg.pad_token_id).astype(jnp.int32)
    return jnp.cumsum(real, axis=1) * real + cfg.pad_token_id


def layer_norm(x: jax.Array, norm: Norm, eps: float) -> jax.Array:
    """LayerNorm in float32, cast back to x's dtype."""
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    out = (x32 - mean) * jax.lax.rsqrt(var + eps) * norm.weight.astype(jnp.float32) + norm.bias.astype(jnp.float32)
    return out.astype(x.dtype)


def dense(x: jax.Array, layer: Dense) -> jax.Array:
    """x [..., in] @ weight [in, out] + bias."""
    return jnp.matmul(x, layer.weight, precision=matmul_precision(x, layer.weight)) + layer.bias


def activate(x: jax.Array, activation: str) -> jax.Array:
    """The MLP's activation: exact GELU, its tanh approximation, or ReLU."""
    if activation == "relu":
        return jax.nn.relu(x)
    return jax.nn.gelu(x, approximate=activation == "gelu_tanh")


def attention(cfg: EncoderConfig, x: jax.Array, lw: EncoderLayer, key_mask: jax.Array) -> jax.Array:
    """Bidirectional multi-head attention of x [B, T, D]; key_mask [B, T] marks the keys a row may read."""
    heads = lambda t: t.reshape(*t.shape[:2], cfg.num_heads, cfg.head_dim)  # noqa: E731
    q, k, v = heads(dense(x, lw.query)), heads(dense(x, lw.key)), heads(dense(x, lw.value))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=matmul_precision(q, k)).astype(jnp.float32)
    scores = jnp.where(key_mask[:, None, None, :], scores * cfg.head_dim**-0.5, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v, precision=matmul_precision(probs, v))
    return dense(out.reshape(x.shape), lw.attn_out)


def encoder_layer(cfg: EncoderConfig, x: jax.Array, lw: EncoderLayer, key_mask: jax.Array) -> jax.Array:
    """One post-LN layer: x + attention, normed; then x + MLP, normed."""
    x = layer_norm(x + attention(cfg, x, lw, key_mask), lw.attn_norm, cfg.layer_norm_eps)
    mlp = dense(activate(dense(x, lw.mlp_in), cfg.activation), lw.mlp_out)
    return layer_norm(x + mlp, lw.mlp_norm, cfg.layer_norm_eps)


def encode(weights: EncoderWeights, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
    """Final hidden states [B, T, D] of tokens [B, T] (types in bit TYPE_SHIFT), row b's first lengths[b] real."""
    cfg = weights.config
    ids, types = split_types(tokens)
    if not cfg.token_types:  # RoBERTa's (and a one-type BERT's) token type is 0 everywhere, as HF's buffer
        types = jnp.zeros_like(types)
    x = weights.words[ids] + weights.types[types] + weights.positions[position_ids(cfg, ids)]  # HF's order
    x = layer_norm(x, weights.embed_norm, cfg.layer_norm_eps)
    key_mask = jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]
    for lw in weights.layers:
        x = encoder_layer(cfg, x, lw, key_mask)
    return x
