"""One attention interface over whatever KV cache the model carries.

`attend` reads the cache after the current step's K/V were written, so a query at position p
sees keys 0..p (within the layer's sliding window or attention chunk, `key_span`), its scores biased by ALiBi's
per-head slopes where the model has them (`alibi`; every path but the native CPU kernels). The contiguous
cache uses the dense `jnp` path, or on CPU for a few queries per sequence (decode, verification)
a native kernel that reads only the visible keys; the paged cache dispatches to `pallas_kernels`
(the Pallas kernel, or its `jnp` reference, as the cache's backend says, and the reference for
shapes the kernel cannot run); on a mesh the kernels run per device under `shard_map`
(`sharded_attention`). Queries of one call sit at consecutive positions. Every path takes
chunked layers (Llama 4).
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp

import pallas_kernels
from jaxinfer.cache.contiguous import KVCache
from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.cache.ragged_view import RaggedPagedCache, per_token_attend
from jaxinfer.kernels.cpu import decode_attention, decode_attention_applies, paged_decode_attention
from jaxinfer.kernels.precision import matmul_precision
from jaxinfer.models.alibi import distance, grouped_slopes
from jaxinfer.models.blocked_attention import (
    NEG_INF,
    blocked_rows_attention,
    blocked_token_attention,
    cap_scores,
    sink_logits,
    softmax_with_sinks,
)
from jaxinfer.models.key_span import visible_keys
from jaxinfer.models.sharded_attention import per_shard_rows_attention

logger = logging.getLogger(__name__)

ATTENTION_BACKENDS = ("auto", "reference", "pallas")


def resolve_backend(name: str) -> str:
    """"auto" -> Pallas kernels on TPU/GPU, the jnp reference on CPU."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend {name!r} is not one of {', '.join(ATTENTION_BACKENDS)}")
    if name == "auto":
        return "reference" if jax.default_backend() == "cpu" else "pallas"
    return name


def causal_window_mask(q_positions: jax.Array, kv_len: int, window: int, chunk: int = 0) -> jax.Array:
    """[B, T, S] bool: key s is visible to the query at position p iff s <= p and p - s < window (if > 0),
    or s in p's chunk (if chunk > 0: s // chunk == p // chunk)."""
    return visible_keys(jnp.arange(kv_len), q_positions, window, chunk)


def dense_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float | None = None,
    kv_scales: tuple[jax.Array, jax.Array] | None = None, soft_cap: float | None = None,
    sinks: jax.Array | None = None, bias: jax.Array | None = None,
) -> jax.Array:
    """GQA attention: q [B,T,H,K], k [B,KV,S,K], v [B,KV,K,S], mask [B,T,S] -> [B,T,H,K]; f32 softmax.

    kv_scales (k, v) [B, KV, S] dequantize fp8 keys and values: they scale each key's score
    and each value's probability, so the cache is widened to q's dtype but never multiplied.
    soft_cap: scaled scores pass through cap * tanh(score / cap) before the mask (Gemma 2).
    sinks [H]: each head's attention-sink logit, a key without a value (GPT-OSS).
    bias [B, KV, G, T, S] f32 (or broadcasting to it): added to the capped scores (ALiBi, `dense_alibi_bias`).
    """
    b, t, h, d = q.shape
    kv_heads = k.shape[1]
    scale = d**-0.5 if scale is None else scale
    if kv_scales is not None:
        k, v = k.astype(q.dtype), v.astype(q.dtype)
    qg = q.reshape(b, t, kv_heads, h // kv_heads, d).astype(k.dtype)
    # float32 results keep bf16 operands on XLA:CPU's bf16 dot path (see layers.linear).
    precision = matmul_precision(qg, k)
    scores = jnp.einsum("btkgd,bksd->bkgts", qg, k, precision=precision, preferred_element_type=jnp.float32)
    scores = scores * (scale if kv_scales is None else scale * kv_scales[0][:, :, None, None, :])
    scores = cap_scores(scores, soft_cap)
    if bias is not None:
        scores = scores + bias
    scores = jnp.where(mask[:, None, None, :, :], scores, NEG_INF)
    probs = softmax_with_sinks(scores, None if sinks is None else sink_logits(sinks, kv_heads)[None, :, :, None, None])
    probs = (probs if kv_scales is None else probs * kv_scales[1][:, :, None, None, :]).astype(v.dtype)
    out = jnp.einsum("bkgts,bkds->btkgd", probs, v, precision=precision, preferred_element_type=jnp.float32)
    return out.reshape(b, t, h, d).astype(q.dtype)


def dense_alibi_bias(slopes: jax.Array, q_positions: jax.Array, kv_len: int, kv_heads: int) -> jax.Array:
    """ALiBi's bias [B, KV, G, T, S] f32 for queries at q_positions [B, T] over keys 0..kv_len-1 (slopes [H])."""
    keys_behind = distance(jnp.arange(kv_len), q_positions)  # [B, T, S]
    return grouped_slopes(slopes, kv_heads)[None, :, :, None, None] * keys_behind[:, None, None]


@functools.cache
def _log_native_fallback(feature: str) -> None:
    """One line per feature the native CPU attention kernels lack, when its layers leave them."""
    logger.info("attention %s: the native CPU attention kernels do not take them; such layers take the XLA (jnp) "
                "attention path", feature)


def native_kernel_applies(soft_cap: float | None, sinks: jax.Array | None = None,
                          alibi: jax.Array | None = None) -> bool:
    """Whether the native CPU attention kernels can run a layer (they take a scale, a window and a chunk; no cap,
    no sinks, no ALiBi slopes)."""
    missing = ("sinks" if sinks is not None else "soft caps" if soft_cap is not None
               else "ALiBi slopes" if alibi is not None else None)
    if missing is not None:
        _log_native_fallback(missing)
    return missing is None


@functools.cache
def _log_fallback(reason: str) -> None:
    """One warning per distinct shape the kernel cannot run (traces repeat; logs should not)."""
    logger.warning("paged attention falls back to the jnp reference: %s", reason)


def kernel_backend(cache: PagedKVCache, head_dim: int) -> str | None:
    """The `backend` argument for pallas_kernels: the cache's platform (None: the default backend's
    kernel) or "reference".

    "auto" must always give a working model, so a shape the kernel cannot run (see
    `pallas_kernels.unsupported_reason`) takes the reference path, with one log line.
    """
    if cache.backend == "reference":
        return "reference"
    impl = pallas_kernels.choose_implementation(cache.platform, cache.interpret)
    if impl == "reference":
        return "reference"
    reason = pallas_kernels.unsupported_reason(impl, head_dim, cache.value_dtype, cache.page_size, cache.quantized)
    if reason is None:
        return cache.platform
    _log_fallback(reason)
    return "reference"


def paged_rows_attend(
    q: jax.Array,
    cache: PagedKVCache,
    layer: int,
    window: int,
    lengths: jax.Array,
    page_table: jax.Array,
    query_lens: jax.Array,
    scale: float | None = None,
    soft_cap: float | None = None,
    sinks: jax.Array | None = None,
    chunk: int = 0,
    alibi: jax.Array | None = None,
) -> jax.Array:
    """q [B, T, H, K]: the first query_lens[b] queries of row b end at position lengths[b]-1."""
    backend = kernel_backend(cache, q.shape[-1])
    kernel = functools.partial(_rows_kernel, window=window, interpret=cache.interpret, backend=backend,
                               scale=scale, soft_cap=soft_cap, single_split=cache.batch_invariant, chunk=chunk)
    pools = (cache.k_pages[layer], cache.v_pages[layer])
    scales = (cache.k_scales[layer], cache.v_scales[layer]) if cache.quantized else ()
    rows = (lengths, page_table, query_lens)
    # A kernel's custom call has no partitioning rule: on a mesh each device runs it on its shard.
    # (The jnp reference is plain HLO that XLA partitions itself.)
    if backend != "reference" and cache.layout.size > 1:
        return per_shard_rows_attention(kernel, q, pools, scales, rows, cache.layout, sinks, alibi)
    return kernel(q, *pools, *rows, *scales, sinks=sinks, alibi=alibi)


def _rows_kernel(
    q: jax.Array,  # [B, T, H, K]
    k_pages: jax.Array,  # [KV, P, page_size, K]
    v_pages: jax.Array,
    lengths: jax.Array,  # [B]
    page_table: jax.Array,  # [B, pages_per_row]
    query_lens: jax.Array,  # [B]
    *scales: jax.Array,  # () or k, v scales [KV, P, page_size]
    window: int,
    interpret: bool,
    backend: str | None,
    scale: float | None = None,
    soft_cap: float | None = None,
    single_split: bool = False,
    sinks: jax.Array | None = None,
    chunk: int = 0,
    alibi: jax.Array | None = None,
) -> jax.Array:
    """The decode kernel for one query per row, the ragged one for several: [B, T, H, K]."""
    common = dict(sliding_window=window or None, interpret=interpret, backend=backend, sm_scale=scale,
                  soft_cap=soft_cap, num_splits=1 if single_split else None, attention_chunk=chunk or None)
    if sinks is not None:
        common.update(sinks=sinks)
    if alibi is not None:
        common.update(alibi_slopes=alibi)
    if scales:
        common.update(k_scales=scales[0], v_scales=scales[1])
    if q.shape[1] == 1:
        return pallas_kernels.paged_attention(q[:, 0], k_pages, v_pages, lengths, page_table, **common)[:, None]
    return pallas_kernels.ragged_paged_attention(q, k_pages, v_pages, lengths, page_table, query_lens, **common)


def gathered_rows_attend(
    q: jax.Array,
    cache: PagedKVCache,
    layer: int,
    window: int,
    lengths: jax.Array,
    page_table: jax.Array,
    query_lens: jax.Array,
    scale: float | None = None,
    soft_cap: float | None = None,
    sinks: jax.Array | None = None,
    chunk: int = 0,
    alibi: jax.Array | None = None,
) -> jax.Array:
    """paged_rows_attend for the CPU: few queries -> the native kernel reading the pages in place;
    otherwise XLA attention over blocks of each row's pages, up to the step's longest row (one
    query per row, as an engine step's tokens are: a key loop per block of tokens); chunk: each query
    sees its own attention chunk's keys only."""
    dtype = q.dtype if cache.quantized else cache.value_dtype
    steps = jnp.arange(q.shape[1])
    positions = (lengths - query_lens)[:, None] + steps[None, :]
    positions = jnp.where(steps[None, :] < query_lens[:, None], positions, -1)  # no query: no keys
    # The native kernel reads 16/32-bit float pages, and int8 pages with their scales; fp8 pages
    # take XLA's path.
    int8 = cache.value_dtype == jnp.int8
    if (cache.cpu_kernels and (int8 or not cache.quantized) and decode_attention_applies(q.shape[1], dtype)
            and native_kernel_applies(soft_cap, sinks, alibi)):
        pools = (cache.k_pages[layer], cache.v_pages[layer])
        scales = dict(k_scales=cache.k_scales[layer], v_scales=cache.v_scales[layer]) if int8 else {}
        return paged_decode_attention(q, *pools, page_table, positions, window, jnp.int8 if int8 else dtype,
                                      scale=scale, chunk=chunk, **scales)
    rows = (lengths, page_table, query_lens)
    if q.shape[1] == 1:
        return blocked_token_attention(q, cache, layer, window, *rows, dtype, scale, soft_cap, sinks, chunk,
                                       alibi=alibi)
    return blocked_rows_attention(q, cache, layer, window, *rows, dtype, scale, soft_cap, sinks, chunk, alibi=alibi)


def image_tokens_attend(
    q: jax.Array, cache: RaggedPagedCache, layer: int, positions: jax.Array, window: int, scale: float | None,
    soft_cap: float | None, sinks: jax.Array | None, chunk: int, alibi: jax.Array | None = None,
) -> jax.Array:
    """A step's attention where some tokens see keys past their position (`key_ends`: Gemma 3's image tokens
    see their whole image): XLA's blocked path, the one that takes a last key per query (the Pallas and native
    kernels mask at the query's position), so a Gemma 3 vision model's ragged steps always take it."""
    dtype = q.dtype if cache.pages.quantized else cache.pages.value_dtype

    def rows_attend(qg: jax.Array, lengths: jax.Array, table: jax.Array, query_lens: jax.Array) -> jax.Array:
        return blocked_token_attention(qg, cache.pages, layer, window, lengths, table, query_lens, dtype, scale,
                                       soft_cap, sinks, chunk, cache.key_ends, alibi)

    return per_token_attend(q, cache, positions, rows_attend)


def all_keys_attend(q: jax.Array, pages: PagedKVCache, lengths: jax.Array, live: jax.Array, scale: float) -> jax.Array:
    """q [T, H, K]: token t attends every one of the first lengths[t] keys of its row of pages.page_table
    (layer 0), no causal mask (an encoder-decoder's cross-attention: cache/cross_pool); live [T] bool (padding
    tokens attend no key, their outputs never read) -> [T, H, K].

    Each token is a one-query row whose query sits at position lengths - 1, so the paged kernels' causal mask
    hides nothing: the same kernels as self-attention (Pallas decode on GPU/TPU, XLA's blocked key loop on CPU).
    """
    rows_attend = gathered_rows_attend if pages.backend == "reference" else paged_rows_attend
    return rows_attend(q[:, None], pages, 0, 0, lengths, pages.page_table, live.astype(jnp.int32), scale)[:, 0]


def paged_attend(
    q: jax.Array, cache: PagedKVCache, layer: int, positions: jax.Array, window: int, scale: float | None = None,
    soft_cap: float | None = None, sinks: jax.Array | None = None, chunk: int = 0, alibi: jax.Array | None = None,
) -> jax.Array:
    """Attention over the paged cache: the decode kernel for one query, the ragged one for several."""
    lengths = positions[:, -1] + 1
    query_lens = jnp.full_like(lengths, q.shape[1])
    return paged_rows_attend(q, cache, layer, window, lengths, cache.page_table, query_lens, scale, soft_cap, sinks,
                             chunk, alibi)


def attend(
    q: jax.Array, cache: KVCache | PagedKVCache, layer: int, positions: jax.Array, window: int,
    scale: float | None = None, soft_cap: float | None = None, sinks: jax.Array | None = None, chunk: int = 0,
    alibi: jax.Array | None = None,
) -> jax.Array:
    """Attention of q [B, T, H, K] at positions [B, T] over `layer` of the cache.

    scale: of the q.k scores (None: head_dim ** -0.5); soft_cap: scores capped by cap * tanh(s / cap)
    (the Pallas kernels and the jnp paths cap; the native CPU kernels cannot, so capped layers skip them);
    sinks [H]: attention-sink logits (GPT-OSS; the jnp paths and the Pallas kernels take them; layers with
    sinks skip the native CPU kernels and, on a mesh, the kernels under shard_map); chunk: Llama 4's attention
    chunk, the keys of the query's own chunk only (every path takes it); alibi [H]: ALiBi slopes, each head's
    scores plus slope * (key position - query position) (BLOOM, MPT; the jnp paths and the Pallas kernels take
    them, the native CPU kernels do not: such layers take XLA's path there).
    """
    if isinstance(cache, RaggedPagedCache) and cache.key_ends is not None:
        return image_tokens_attend(q, cache, layer, positions, window, scale, soft_cap, sinks, chunk, alibi)
    if isinstance(cache, RaggedPagedCache):
        rows_attend = gathered_rows_attend if cache.pages.backend == "reference" else paged_rows_attend
        return per_token_attend(
            q, cache, positions,
            lambda qg, *rows: rows_attend(qg, cache.pages, layer, window, *rows, scale, soft_cap, sinks, chunk, alibi),
        )
    if isinstance(cache, PagedKVCache):
        return paged_attend(q, cache, layer, positions, window, scale, soft_cap, sinks, chunk, alibi)
    k, v = cache.k[layer], cache.v[layer]
    mask = causal_window_mask(positions, k.shape[2], window, chunk)
    bias = None if alibi is None else dense_alibi_bias(alibi, positions, k.shape[2], k.shape[1])
    if cache.quantized:
        # The native kernel reads 16/32-bit floats without scales: fp8 takes XLA's dense path.
        scales = (cache.k_scales[layer][..., 0], cache.v_scales[layer][..., 0])
        return dense_attention(q, k, v, mask, scale, kv_scales=scales, soft_cap=soft_cap, sinks=sinks, bias=bias)
    if (cache.cpu_kernels and decode_attention_applies(q.shape[1], k.dtype)
            and native_kernel_applies(soft_cap, sinks, alibi)):
        return decode_attention(q, k, v, positions, window, scale, chunk)
    return dense_attention(q, k, v, mask, scale, soft_cap=soft_cap, sinks=sinks, bias=bias)
