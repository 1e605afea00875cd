"""Attention of prefill chunks over paged K/V on XLA, in key blocks up to the step's longest row.

An engine step's page table is as wide as the longest sequence the engine allows (narrowing it
per step would multiply the compiled programs), so gathering every row's whole table and
attending densely costs as much for a 40-token prompt as for a 2000-token one. Here the keys
are visited in blocks of pages with an online softmax, and a dynamic trip count stops after
the block holding the step's longest row: one program, with work that follows the real
context lengths. Used where no kernel reads the pages in place (the CPU's prefill chunks,
quantized pages).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.paged_kv_cache import PagedKVCache
from jaxinfer.precision import matmul_precision

NEG_INF = -1e30  # finite, so fully-masked rows (padding) give a uniform softmax, not NaN
BLOCK_KEYS = 256  # keys per block: a few blocks even at long contexts, small score tiles


def gather_pages(cache: PagedKVCache, pools: list[jax.Array], scales, layer: int, table: jax.Array, dtype) -> jax.Array:
    """The pages of each row as one contiguous block [R, KV, S, K] in dtype (dequantized)."""
    gathered = cache.from_storage(pools[layer][:, table])  # [KV, R, P, page, K]
    if scales is not None:
        gathered = gathered.astype(jnp.float32) * scales[layer][:, table][..., None]
    kv, rows, pages, page, dim = gathered.shape
    return gathered.reshape(kv, rows, pages * page, dim).swapaxes(0, 1).astype(dtype)


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
) -> jax.Array:
    """q [R, T, H, K]: the first query_lens[r] queries of row r end at position lengths[r]-1.

    Keys are read in dtype with float32 scores and softmax, as the dense path does.
    """
    rows, steps, heads, dim = q.shape
    block = _block_pages(cache.page_size, page_table.shape[1])
    table = jnp.pad(page_table, ((0, 0), (0, -page_table.shape[1] % block)))
    block_keys = block * cache.page_size
    kv_heads = cache.k_pages[layer].shape[0]
    qg = q.reshape(rows, steps, kv_heads, heads // kv_heads, dim).astype(dtype)
    positions = (lengths - query_lens)[:, None] + jnp.arange(steps)[None, :]
    live = jnp.arange(steps)[None, :] < query_lens[:, None]
    precision = matmul_precision(qg)

    def visit(index: jax.Array, carry: tuple[jax.Array, jax.Array, jax.Array]):
        best, total, acc = carry
        columns = jax.lax.dynamic_slice_in_dim(table, index * block, block, axis=1)
        k = gather_pages(cache, cache.k_pages, cache.k_scales, layer, columns, dtype)
        v = gather_pages(cache, cache.v_pages, cache.v_scales, layer, columns, dtype)
        keys = index * block_keys + jnp.arange(block_keys)
        visible = (keys[None, None, :] <= positions[:, :, None]) & live[:, :, None]
        if window > 0:
            visible &= positions[:, :, None] - keys[None, None, :] < window
        scores = jnp.einsum("rtkgd,rksd->rkgts", qg, k, precision=precision, preferred_element_type=jnp.float32)
        scores = jnp.where(visible[:, None, None], scores * dim**-0.5, NEG_INF)
        new_best = jnp.maximum(best, scores.max(-1))
        fade = jnp.exp(best - new_best)  # 0 once a real key beats the masked placeholder
        probs = jnp.exp(scores - new_best[..., None])
        total = total * fade + probs.sum(-1)
        update = jnp.einsum("rkgts,rksd->rkgtd", probs.astype(dtype), v, precision=precision,
                            preferred_element_type=jnp.float32)
        return new_best, total, acc * fade[..., None] + update

    shape = (rows, kv_heads, heads // kv_heads, steps)
    start = (jnp.full(shape, NEG_INF, jnp.float32), jnp.zeros(shape, jnp.float32), jnp.zeros((*shape, dim), jnp.float32))
    num_blocks = jnp.maximum(1, -(-jnp.max(lengths) // block_keys))  # at least one: padding-only steps stay finite
    _, total, acc = jax.lax.fori_loop(0, num_blocks, visit, start)
    out = acc / total[..., None]  # [R, KV, G, T, K]
    return out.transpose(0, 3, 1, 2, 4).reshape(rows, steps, heads, dim).astype(q.dtype)
