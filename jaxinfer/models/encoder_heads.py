"""What an encoder's pooled pass returns: its final hidden states pooled per row (embeddings), or a
sequence classifier's logits. Both classifier heads read the first token's state ([CLS] / <s>):
BERT's through its pooler (dense + tanh) then `classifier`; RoBERTa's and XLM-R's through
`classifier.dense` + tanh then `classifier.out_proj` (HF's RobertaClassificationHead)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.models.encoder import Dense, EncoderWeights, dense, encode


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class EncoderHead:
    """A sequence classifier's head: first-token state -> tanh(dense) -> out [D, num_labels]."""

    dense: Dense  # BERT's pooler.dense, RoBERTa's classifier.dense: [D, D]
    out: Dense  # BERT's classifier, RoBERTa's classifier.out_proj: [D, num_labels]


def head_logits(head: EncoderHead, first: jax.Array) -> jax.Array:
    """Float32 logits [B, num_labels] of the first tokens' states [B, D]."""
    return dense(jnp.tanh(dense(first, head.dense)), head.out).astype(jnp.float32)


def pool(hidden: jax.Array, lengths: jax.Array, pooling: str) -> jax.Array:
    """Float32 [B, D]: hidden [B, T, D] pooled over each row's first lengths[b] tokens: "cls" (the first
    token's), "mean" or "last"."""
    hidden = hidden.astype(jnp.float32)
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "last":
        return jnp.take_along_axis(hidden, (lengths - 1)[:, None, None], axis=1)[:, 0]
    real = (jnp.arange(hidden.shape[1])[None, :] < lengths[:, None])[..., None]
    return jnp.sum(jnp.where(real, hidden, 0.0), axis=1) / lengths[:, None]


def encoder_pooled(
    weights: EncoderWeights, tokens: jax.Array, lengths: jax.Array, head: EncoderHead | None, pooling: str,
) -> jax.Array:
    """The pooled pass of an encoder (runtime/embeddings): float32 [B, D] embeddings of tokens [B, T], or
    with a classifier's head its logits [B, num_labels] (the head reads the first token whatever `pooling`)."""
    hidden = encode(weights, tokens, lengths)
    return pool(hidden, lengths, pooling) if head is None else head_logits(head, hidden[:, 0])
