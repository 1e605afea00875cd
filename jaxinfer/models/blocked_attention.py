"""Attention of prefill chunks over paged K/V on XLA, in key blocks up to the last key each query sees.

An engine step's page table is as wide as the longest sequence the engine allows (narrowing it
per step would multiply the compiled programs), so gathering every row's whole table and
attending densely costs as much for a 40-token prompt as for a 2000-token one. Here the keys
are visited in blocks of pages with an online softmax, and dynamic trip counts stop after the
block holding the last key a block of queries sees (per row for a step's few prefill rows):
one program, with work that follows the real context lengths. Used where no kernel reads the
pages in place (the CPU's prefill chunks, quantized pages).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.kernels.precision import matmul_precision
from jaxinfer.models.alibi import distance, grouped_slopes
from jaxinfer.models.key_span import first_key, visible_keys

NEG_INF = -1e30  # finite, so fully-masked rows (padding) give a uniform softmax, not NaN
BLOCK_KEYS = 256  # keys per block: a few blocks even at long contexts, small score tiles
QUERY_BLOCK = 256  # queries per block in long chunks: each block stops at its own last position
LOOPED_ROWS = 4  # up to this many rows (prefill chunks) each get their own key loop, to their own length
TOKEN_BLOCK = 16  # one-query rows (an engine step's tokens) per shared key loop


def cap_scores(scores: jax.Array, soft_cap: float | None) -> jax.Array:
    """Attention logit soft-capping: cap * tanh(scores / cap); scores as they are without a cap."""
    return scores if soft_cap is None else soft_cap * jnp.tanh(scores / soft_cap)


def sink_logits(sinks: jax.Array, kv_heads: int) -> jax.Array:
    """Per-head attention-sink logits [H] as [KV, G] float32 (query head h = kv head * G + g)."""
    return sinks.astype(jnp.float32).reshape(kv_heads, -1)


def softmax_with_sinks(scores: jax.Array, sinks: jax.Array | None) -> jax.Array:
    """Softmax over the last axis, with each head's sink logit as one more key that has no value
    (GPT-OSS): the sink takes its share of the probability mass and gives nothing back.

    sinks broadcasts against scores[..., :1]; None is the plain softmax.
    """
    if sinks is None:
        return jax.nn.softmax(scores, axis=-1)
    best = jnp.maximum(scores.max(-1, keepdims=True), sinks)
    weights = jnp.exp(scores - best)
    return weights / (weights.sum(-1, keepdims=True) + jnp.exp(sinks - best))


def gather_pages(cache: PagedKVCache, pools: list[jax.Array], scales, layer: int, table: jax.Array, dtype) -> jax.Array:
    """The pages of each row as one contiguous block [KV, R, S, K] in dtype (dequantized)."""
    gathered = cache.from_storage(pools[layer][:, table])  # [KV, R, P, page, K]
    if scales is not None:
        gathered = gathered.astype(jnp.float32) * scales[layer][:, table][..., None]
    kv, rows, pages, page, dim = gathered.shape
    return gathered.reshape(kv, rows, pages * page, dim).astype(dtype)


def _block_pages(page_size: int, width: int) -> int:
    return max(1, min(width, BLOCK_KEYS // page_size))


def blocked_rows_attention(
    q: jax.Array,
    cache: PagedKVCache,
    layer: int,
    window: int,
    lengths: jax.Array,
    page_table: jax.Array,
    query_lens: jax.Array,
    dtype: jnp.dtype,
    scale: float | None = None,
    soft_cap: float | None = None,
    sinks: jax.Array | None = None,
    chunk: int = 0,
    key_ends: jax.Array | None = None,
    alibi: jax.Array | None = None,
) -> jax.Array:
    """q [R, T, H, K]: the first query_lens[r] queries of row r end at position lengths[r]-1.

    scale: of the scores (None: head_dim ** -0.5); soft_cap: scores pass cap * tanh(s / cap);
    sinks [H]: each head's attention-sink logit (see `softmax_with_sinks`); chunk: each query sees
    its own attention chunk's keys only (`key_span`); key_ends [R]: row r's queries also see the keys
    before |key_ends[r]| past their own position (Gemma 3's image tokens; 0: none; negative: from the first key too,
    the window aside: PaliGemma's prefix); alibi [H]: ALiBi slopes
    (scores plus slope * (key position - query position)).

    Keys are read in dtype with float32 scores and softmax, as the dense path does. Queries go
    in blocks of QUERY_BLOCK, each visiting only the key blocks its own positions can see (a
    chunk's early queries skip the keys after them; with a window or an attention chunk, the keys before it). A step
    with up to LOOPED_ROWS rows loops over each row's keys separately, so a short prompt does
    not run to its neighbour's length; more rows (decodes on quantized pages) share one loop.
    """
    rows, steps, heads, dim = q.shape
    kv_heads = cache.k_pages[layer].shape[0]
    # [KV, R, G, T, K] once: the score dots then run without a transpose per key block.
    qg = q.reshape(rows, steps, kv_heads, heads // kv_heads, dim).transpose(2, 0, 3, 1, 4).astype(dtype)
    block = _block_pages(cache.page_size, page_table.shape[1])
    table = jnp.pad(page_table, ((0, 0), (0, -page_table.shape[1] % block)))
    groups = [slice(r, r + 1) for r in range(rows)] if rows <= LOOPED_ROWS else [slice(0, rows)]
    sink = None if sinks is None else sink_logits(sinks, kv_heads)[:, None, :, None]  # [KV, 1, G, 1]
    slopes = None if alibi is None else grouped_slopes(alibi, kv_heads)[:, None, :, None, None]  # [KV, 1, G, 1, 1]

    def attend_rows(g: slice) -> jax.Array:
        parts = [
            _query_block(qg[:, g, :, first : first + QUERY_BLOCK], cache, layer, window, lengths[g], table[g],
                         query_lens[g], first, block, dtype, dim**-0.5 if scale is None else scale, soft_cap, sink,
                         chunk, None if key_ends is None else key_ends[g], slopes)
            for first in range(0, steps, QUERY_BLOCK)
        ]
        return _concatenate(parts, axis=3)

    out = _concatenate([attend_rows(g) for g in groups], axis=1)  # [KV, R, G, T, K]
    return out.transpose(1, 3, 0, 2, 4).reshape(rows, steps, heads, dim).astype(q.dtype)


def blocked_token_attention(
    q: jax.Array,
    cache: PagedKVCache,
    layer: int,
    window: int,
    lengths: jax.Array,
    page_table: jax.Array,
    query_lens: jax.Array,
    dtype: jnp.dtype,
    scale: float | None = None,
    soft_cap: float | None = None,
    sinks: jax.Array | None = None,
    chunk: int = 0,
    key_ends: jax.Array | None = None,
    alibi: jax.Array | None = None,
) -> jax.Array:
    """blocked_rows_attention of one-query rows q [N, 1, H, K] (an engine step's tokens, each its own
    row), TOKEN_BLOCK rows at a time: a block gathers its rows' pages [KV, rows, keys, K] one key
    block at a time up to its own last position, so nothing the size of [N, S] is materialised.
    Under the cache's `batch_invariant` every block has TOKEN_BLOCK rows (padding rows attend no
    key), so a token's arithmetic does not depend on how many share its step."""
    rows = q.shape[0]
    if cache.batch_invariant and rows % TOKEN_BLOCK:
        pad = TOKEN_BLOCK - rows % TOKEN_BLOCK
        grow = lambda a: jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))  # noqa: E731
        out = blocked_token_attention(grow(q), cache, layer, window, grow(lengths) + (jnp.arange(rows + pad) >= rows),
                                      grow(page_table), grow(query_lens), dtype, scale, soft_cap, sinks, chunk,
                                      None if key_ends is None else grow(key_ends), alibi)
        return out[:rows]
    block = math.gcd(rows, TOKEN_BLOCK)
    if block == rows:
        return blocked_rows_attention(q, cache, layer, window, lengths, page_table, query_lens, dtype, scale,
                                      soft_cap, sinks, chunk, key_ends, alibi)

    def one(args: tuple[jax.Array, ...]) -> jax.Array:
        ends = args[4] if len(args) > 4 else None
        return blocked_rows_attention(args[0], cache, layer, window, *args[1:4], dtype, scale, soft_cap, sinks, chunk,
                                      ends, alibi)

    split = lambda a: a.reshape(rows // block, block, *a.shape[1:])  # noqa: E731
    ends = () if key_ends is None else (split(key_ends),)
    out = jax.lax.map(one, (split(q), split(lengths), split(page_table), split(query_lens), *ends))
    return out.reshape(q.shape)


def _concatenate(parts: list[jax.Array], axis: int) -> jax.Array:
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=axis)


def _query_block(
    qg: jax.Array,  # [KV, R, G, Tb, K]: queries first .. first + Tb of each row
    cache: PagedKVCache,
    layer: int,
    window: int,
    lengths: jax.Array,
    table: jax.Array,
    query_lens: jax.Array,
    first: int,
    block_pages: int,
    dtype: jnp.dtype,
    scale: float,
    soft_cap: float | None,
    sink: jax.Array | None,  # [KV, 1, G, 1] f32 attention-sink logits
    chunk: int = 0,
    key_ends: jax.Array | None = None,  # [R]
    slopes: jax.Array | None = None,  # [KV, 1, G, 1, 1] f32 ALiBi slopes
) -> jax.Array:
    """Online softmax of one block of queries over the key blocks they can see: [KV, R, G, Tb, K] f32."""
    steps = qg.shape[-2]
    block_keys = block_pages * cache.page_size
    offsets = first + jnp.arange(steps)
    positions = (lengths - query_lens)[:, None] + offsets[None, :]
    live = offsets[None, :] < query_lens[:, None]
    # |key_ends[r]|: row r's queries see the keys before it; negative: a PaliGemma prefix token, window aside
    last = None if key_ends is None else jnp.maximum(positions, jnp.abs(key_ends)[:, None] - 1)
    whole = None if key_ends is None else jnp.broadcast_to((key_ends < 0)[:, None], positions.shape)
    precision = matmul_precision(qg)

    def block(index: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Masked scaled scores [KV, R, G, Tb, S] (f32) of key block `index`, and its values."""
        columns = jax.lax.dynamic_slice_in_dim(table, index * block_pages, block_pages, axis=1)
        k = gather_pages(cache, cache.k_pages, cache.k_scales, layer, columns, dtype)
        v = gather_pages(cache, cache.v_pages, cache.v_scales, layer, columns, dtype)
        keys = index * block_keys + jnp.arange(block_keys)
        visible = visible_keys(keys, positions, window, chunk, last, whole) & live[:, :, None]
        scores = jnp.einsum("krgtd,krsd->krgts", qg, k, precision=precision, preferred_element_type=jnp.float32)
        scores = cap_scores(scores * scale, soft_cap)
        if slopes is not None:
            scores = scores + slopes * distance(keys, positions)[None, :, None]  # [R, Tb, S] per head
        return jnp.where(visible[None, :, None], scores, NEG_INF), v

    def weighted(probs: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.einsum("krgts,krsd->krgtd", probs.astype(dtype), v, precision=precision,
                          preferred_element_type=jnp.float32)

    def opening(index: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        # The first block starts the running max, sum and output itself: a loop starting from
        # zeros made XLA fill a fresh accumulator for every layer (448 queries over 448 keys of a
        # SmolLM layer: 4.7 -> 3.0 ms).
        scores, v = block(index)
        best = scores.max(-1)
        probs = jnp.exp(scores - best[..., None])
        return best, probs.sum(-1), weighted(probs, v)

    def visit(index: jax.Array, carry: tuple[jax.Array, jax.Array, jax.Array]):
        best, total, acc = carry
        scores, v = block(index)
        new_best = jnp.maximum(best, scores.max(-1))
        fade = jnp.exp(best - new_best)  # 0 once a real key beats the masked placeholder
        probs = jnp.exp(scores - new_best[..., None])
        return new_best, total * fade + probs.sum(-1), acc * fade[..., None] + weighted(probs, v)

    first_block, num_blocks = _visited_blocks(positions, live, window, block_keys, chunk, last, whole)
    best, total, acc = jax.lax.fori_loop(first_block + 1, num_blocks, visit, opening(first_block))
    if sink is not None:  # the sink's share of the mass, relative to the running max (see softmax_with_sinks)
        total = total + jnp.exp(sink - best)
    return acc / total[..., None]


def _visited_blocks(
    positions: jax.Array, live: jax.Array, window: int, block_keys: int, chunk: int = 0,
    last_keys: jax.Array | None = None, whole: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """[first, end) key blocks holding a key some live query sees; at least one (padding stays finite)."""
    last = jnp.max(jnp.where(live, positions if last_keys is None else last_keys, 0))
    end = last // block_keys + 1  # >= 1 even for padding-only rows, which stay finite
    if window <= 0 and chunk <= 0:
        return jnp.zeros_like(end), end
    earliest = jnp.min(jnp.where(live, first_key(positions, window, chunk, whole), last))
    return jnp.minimum(earliest // block_keys, end - 1), end
