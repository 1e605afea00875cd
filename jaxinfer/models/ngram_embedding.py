"""Qwen4-Exp's per-layer embeddings (PLE, transformers' `Qwen4ExpTextPLELayer`): hashed n-gram embeddings of the
tokens, gated into every residual stream and passed through a dilated causal conv.

Each token's n-gram rows (models/ngram_hash) are looked up in the layer's table and concatenated, [W]; from them
a value [D] and one key per stream [S, D]. Each stream, normed, meets its key (the dot product over sqrt(D),
its signed square root through a sigmoid) to gate the shared value; the gated values [S * D] are added to the
streams together with silu(a depthwise conv over the normed gated values of this token and the `ple_kernel` - 1
before it, each `ngram_size` tokens apart).

The conv's earlier inputs and the n-grams' earlier tokens are read back from the layer's rows in the cache
(models/token_rows: [conv input S * D | token id digits] per token), written first, so whole sequences and engine
steps (chunked prefill, decode) read them alike; zeros and EOS before a sequence.
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
from jaxinfer.models.ngram_hash import ngram_rows, segment_context
from jaxinfer.models.token_rows import DIGITS, TokenRows, digits_token, layer_rows, read_back, token_digits, write_rows
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


def ngram_context(rows: TokenRows, tokens: jax.Array, positions: jax.Array, order: int, eos: int,
                  lo: int) -> list[jax.Array]:
    """Each of the N flat tokens' n-gram context (`ngram_hash.segment_context`): the token and the order - 1
    before it, read back from the layer's rows (their digits from column lo; eos before the sequence)."""
    back = positions[:, None] - jnp.arange(1, order)  # [N, order - 1]
    earlier = jnp.where(back >= 0, digits_token(read_back(rows, back, lo, lo + DIGITS)), eos)
    return segment_context([tokens] + [earlier[:, i] for i in range(order - 1)], eos)


def conv_windows(rows: TokenRows, current: jax.Array, positions: jax.Array, kernel: int,
                 dilation: int) -> jax.Array:
    """Each flat token's conv window [N, kernel, C]: the inputs `dilation` apart before it (read back from the
    rows' first C columns, zeros before the sequence), then its own current [N, C]."""
    back = positions[:, None] - jnp.arange(kernel - 1, 0, -1) * dilation  # earliest first
    earlier = jnp.where((back >= 0)[..., None], read_back(rows, back, 0, current.shape[-1]), 0)
    return jnp.concatenate([earlier.astype(current.dtype), current[:, None]], axis=1)


def add_ngram_embedding(w: Any, x: jax.Array, tokens: jax.Array, positions: jax.Array, cache: Any, layer: int,
                        fields: Qwen4ExpFields, table: NgramTable, eps: float) -> tuple[jax.Array, Any]:
    """The streams x [B, T, S * D] plus the gated n-gram embedding of tokens [B, T] at positions [B, T] and its
    conv (w: the layer, its `ple_*` leaves); its rows ([conv input | token digits]) written to the cache."""
    B, T, SD = x.shape
    S, D, N = fields.streams, SD // fields.streams, B * T
    flat, where = tokens.reshape(N), positions.reshape(N)
    digits = token_digits(tokens, x.dtype)
    cache = write_rows(cache, layer, jnp.concatenate([jnp.zeros_like(x), digits], axis=-1), positions)
    rows = layer_rows(cache, layer, B, T, SD + DIGITS)
    context = ngram_context(rows, flat, where, fields.ngram_size, fields.eos_token_id, SD)
    table_rows = w.ple_table.reshape(-1, w.ple_table.shape[-1])  # the shards end to end
    embeds = jnp.take(table_rows, ngram_rows(context, table, fields.heads_per_ngram), axis=0).reshape(N, -1)
    embeds = embeds.astype(x.dtype)
    keys = grouped_rms_norm(linear(embeds, w.ple_key), w.ple_key_norm, D, eps).reshape(N, S, D)
    queries = grouped_rms_norm(x.reshape(N, SD), w.ple_query_norm, D, eps).reshape(N, S, D)
    gate = jnp.sum(keys * queries, axis=-1, keepdims=True) / math.sqrt(D)
    gate = jnp.sqrt(jnp.maximum(jnp.abs(gate), 1e-6)) * jnp.sign(gate)
    gated = (jax.nn.sigmoid(gate) * linear(embeds, w.ple_value)[:, None, :]).reshape(N, SD)
    normed = grouped_rms_norm(gated, w.ple_conv_norm, D, eps)
    cache = write_rows(cache, layer, jnp.concatenate([normed.reshape(B, T, SD), digits], axis=-1), positions)
    rows = layer_rows(cache, layer, B, T, SD + DIGITS)
    windows = conv_windows(rows, normed, where, fields.ple_kernel, fields.ngram_size)
    conv = jnp.sum(windows * w.ple_conv[:, 0].T.astype(x.dtype), axis=1)
    return x + (gated + jax.nn.silu(conv)).reshape(B, T, SD), cache
