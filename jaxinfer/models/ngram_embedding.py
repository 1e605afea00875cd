"""Qwen4-Exp's per-layer embeddings (PLE, transformers' `Qwen4ExpTextPLELayer`): hashed n-gram embeddings of the
tokens, gated into every residual stream and passed through a dilated causal conv.

Each token's n-gram rows (models/ngram_hash) are looked up in the layer's table and concatenated, [W]; from them
a value [D] and one key per stream [S, D]. Each stream, normed, meets its key (the dot product over sqrt(D),
its signed square root through a sigmoid) to gate the shared value; the gated values [S * D] are added to the
streams together with silu(a depthwise conv over the normed gated values of this token and the `ple_kernel` - 1
before it, each `ngram_size` tokens apart).

Whole sequences only (each row from its first token): the conv's earlier inputs and the n-grams' earlier tokens
are read from the row itself, zeros and EOS before it.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.config.qwen4_exp import NgramTable, Qwen4ExpFields
from jaxinfer.models.family import HFLeaf
from jaxinfer.models.gated_residual import grouped_rms_norm
from jaxinfer.models.layers import linear
from jaxinfer.models.ngram_hash import ngram_rows
from jaxinfer.parallel.array_info import ArrayInfo

PLE = "model.layers.{i}.ple."


def ngram_leaves(fields: Qwen4ExpFields, table: NgramTable, hidden: int, parts: int) -> dict[str, ArrayInfo]:
    """A PLE layer's leaves as ArrayInfos: its table in `parts` shards [parts, rows / parts, W / heads], the key
    [W, S * D] and value [W, D] projections, the key's, query's and conv input's zero-centred norms [S * D], the
    conv [S * D, 1, ple_kernel]."""
    W, SD = fields.ple_width, fields.streams * hidden
    norm = ArrayInfo((SD,), (None,), init_value=0.0)
    return dict(ple_table=ArrayInfo((parts, table.rows // parts, W // fields.ngram_heads), (None, None, None)),
                ple_key=ArrayInfo((W, SD), (None, None)), ple_value=ArrayInfo((W, hidden), (None, "embed")),
                ple_key_norm=norm, ple_query_norm=norm, ple_conv_norm=norm,
                ple_conv=ArrayInfo((SD, 1, fields.ple_kernel), (None, None, None)))


def ngram_hf_leaves(fields: Qwen4ExpFields, table: NgramTable, hidden: int, parts: int) -> dict[str, HFLeaf]:
    """Where a PLE layer's leaves live (the table's shards as `{e}`)."""
    W, SD = fields.ple_width, fields.streams * hidden
    norm = lambda name: HFLeaf(PLE + name + ".weight", "same", (SD,))  # noqa: E731
    return dict(
        ple_table=HFLeaf(PLE + "ple_embedding.ngram_embedding.shard_{e}.weight", "same",
                         (table.rows // parts, W // fields.ngram_heads), experts=parts),
        ple_key=HFLeaf(PLE + "key_proj.weight", "transpose", (SD, W)),
        ple_value=HFLeaf(PLE + "value_proj.weight", "transpose", (hidden, W)),
        ple_key_norm=norm("norm_key"), ple_query_norm=norm("norm_query"), ple_conv_norm=norm("norm_conv"),
        ple_conv=HFLeaf(PLE + "conv1d.weight", "same", (SD, 1, fields.ple_kernel)),
    )


def dilated_conv(x: jax.Array, weight: jax.Array, dilation: int) -> jax.Array:
    """Causal depthwise conv of x [B, T, C] by weight [C, 1, K], taps `dilation` tokens apart, zeros before the
    row: out[t] = sum_j weight[:, 0, j] * x[t - (K - 1 - j) * dilation]."""
    K, T = weight.shape[-1], x.shape[1]
    padded = jnp.pad(x, ((0, 0), ((K - 1) * dilation, 0), (0, 0)))
    taps = weight[:, 0].T.astype(x.dtype)  # [K, C]
    return sum(padded[:, j * dilation:j * dilation + T] * taps[j] for j in range(K))


def add_ngram_embedding(w: Any, x: jax.Array, tokens: jax.Array, fields: Qwen4ExpFields, table: NgramTable,
                        eps: float) -> jax.Array:
    """The streams x [B, T, S * D] plus the gated n-gram embedding of tokens [B, T] and its conv (w: the layer,
    its `ple_*` leaves)."""
    S, D = fields.streams, x.shape[-1] // fields.streams
    rows = ngram_rows(tokens, table, fields.heads_per_ngram, fields.eos_token_id)  # [B, T, heads]
    table_rows = w.ple_table.reshape(-1, w.ple_table.shape[-1])  # the shards end to end
    embeds = jnp.take(table_rows, rows, axis=0).reshape(*tokens.shape, -1).astype(x.dtype)
    keys = grouped_rms_norm(linear(embeds, w.ple_key), w.ple_key_norm, D, eps).reshape(*tokens.shape, S, D)
    queries = grouped_rms_norm(x, w.ple_query_norm, D, eps).reshape(*tokens.shape, S, D)
    gate = jnp.sum(keys * queries, axis=-1, keepdims=True) / math.sqrt(D)
    gate = jnp.sqrt(jnp.maximum(jnp.abs(gate), 1e-6)) * jnp.sign(gate)
    gated = (jax.nn.sigmoid(gate) * linear(embeds, w.ple_value)[..., None, :]).reshape(x.shape)
    conv = dilated_conv(grouped_rms_norm(gated, w.ple_conv_norm, D, eps), w.ple_conv, fields.ngram_size)
    return x + gated + jax.nn.silu(conv)
