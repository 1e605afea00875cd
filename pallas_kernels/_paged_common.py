"""Pieces shared by the paged attention kernels: query-row layout, key ranges, online softmax.

Every kernel sees its queries as *rows*: for one sequence and one kv head, row
`r = query * group + head_in_group`. Decode is the special case of one query per
sequence, so decode and ragged (multi-query) attention share one kernel body per
backend. All helpers here are plain `jnp` on values, so they trace the same inside
Triton, Mosaic and the interpreters.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# Finite so that `m_prev - m_next` never becomes `-inf - -inf = nan` for rows that
# have seen no valid key yet.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


@dataclasses.dataclass(frozen=True)
class AttentionParams:
    """Static attention settings shared by every backend."""

    group: int  # q heads per kv head
    page_size: int
    pages_per_block: int  # pages fetched and scored together
    sm_scale: float
    soft_cap: float | None
    sliding_window: int | None
    quantized: bool  # int8 pages with per-token scales
    attention_chunk: int | None = None  # a query sees keys of its own chunk of positions only (Llama 4)

    @property
    def block_k(self) -> int:
        """Keys per block."""
        return self.page_size * self.pages_per_block


def next_power_of_2(x: int) -> int:
    """Smallest power of two >= x (and >= 1)."""
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def default_sm_scale(head_dim: int, sm_scale: float | None) -> float:
    """The softmax scale: 1/sqrt(head_dim) unless given."""
    return 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)


def validate_paged_inputs(
    q_heads: int,
    head_dim: int,
    k_pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
    v_pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
    k_scales: jax.Array | None,  # [num_kv_heads, num_pages, page_size]
    v_scales: jax.Array | None,  # [num_kv_heads, num_pages, page_size]
    sliding_window: int | None,
) -> None:
    """Raise ValueError with a clear message on inconsistent shapes or options."""
    if k_pages.shape != v_pages.shape:
        raise ValueError(f"k_pages {k_pages.shape} and v_pages {v_pages.shape} differ")
    num_kv_heads, _, _, kv_head_dim = k_pages.shape
    if kv_head_dim != head_dim:
        raise ValueError(f"q head_dim {head_dim} != kv head_dim {kv_head_dim}")
    if q_heads % num_kv_heads:
        raise ValueError(f"{q_heads} q heads not divisible by {num_kv_heads} kv heads")
    if (k_scales is None) != (v_scales is None):
        raise ValueError("pass both k_scales and v_scales or neither")
    if k_scales is not None and k_scales.shape != k_pages.shape[:-1]:
        raise ValueError(f"k_scales {k_scales.shape} must be {k_pages.shape[:-1]}")
    if v_scales is not None and v_scales.shape != v_pages.shape[:-1]:
        raise ValueError(f"v_scales {v_scales.shape} must be {v_pages.shape[:-1]}")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")


def queries_to_rows(q: jax.Array, num_kv_heads: int, num_rows: int) -> jax.Array:
    """[batch, max_q, q_heads, head_dim] -> [batch, kv_heads, num_rows, head_dim], zero padded."""
    batch, max_q, q_heads, head_dim = q.shape
    group = q_heads // num_kv_heads
    rows = q.reshape(batch, max_q, num_kv_heads, group, head_dim)
    rows = rows.transpose(0, 2, 1, 3, 4).reshape(batch, num_kv_heads, max_q * group, head_dim)
    return jnp.pad(rows, ((0, 0), (0, 0), (0, num_rows - max_q * group), (0, 0)))


def rows_to_queries(rows: jax.Array, max_q: int, q_heads: int) -> jax.Array:
    """Inverse of `queries_to_rows`: [batch, kv_heads, num_rows, d] -> [batch, max_q, q_heads, d]."""
    batch, num_kv_heads, _, head_dim = rows.shape
    group = q_heads // num_kv_heads
    rows = rows[:, :, : max_q * group].reshape(batch, num_kv_heads, max_q, group, head_dim)
    return rows.transpose(0, 2, 1, 3, 4).reshape(batch, max_q, q_heads, head_dim)


def row_query_index(max_q: int, group: int, num_rows: int) -> jax.Array:
    """[num_rows, 1] int32 query index of each row; padding rows get max_q (never valid)."""
    rows = jnp.arange(num_rows, dtype=jnp.int32)
    return jnp.where(rows < max_q * group, rows // group, max_q)[:, None]


def key_range(
    length: jax.Array,  # [] int32, tokens in the sequence
    query_len: jax.Array,  # [] int32, valid queries (the last ones of the sequence)
    first_row: jax.Array,  # [] int32, first row of this query block
    num_rows: int,  # rows in this query block
    params: AttentionParams,
    capacity: int,  # keys the page table holds: pages_per_seq * page_size
) -> tuple[jax.Array, jax.Array]:
    """Half-open [key_lo, key_hi) of key positions any row of this query block attends.

    key_hi stops at `capacity`: queries past the end of the table (speculative verification
    near the end of the buffer) see every key it holds, and no page beyond its row is read.
    """
    group = jnp.int32(params.group)
    first_query = lax.div(first_row, group)
    last_query = jnp.minimum(lax.div(first_row + (num_rows - 1), group), query_len - 1)
    offset = length - query_len  # position of query 0
    key_hi = jnp.minimum(offset + last_query + 1, capacity)
    if params.attention_chunk is not None:  # the first query's chunk start: later queries' chunks start later
        first_pos = jnp.maximum(offset + first_query, 0)
        key_lo = first_pos - lax.rem(first_pos, jnp.int32(params.attention_chunk))
    elif params.sliding_window is None:
        key_lo = jnp.int32(0)
    else:
        key_lo = jnp.maximum(offset + first_query - (params.sliding_window - 1), 0)
    # A block made only of padding rows attends nothing; nor one whose window lies past the table.
    key_hi = jnp.where(first_query < query_len, jnp.maximum(key_hi, key_lo), key_lo)
    return key_lo, key_hi


def block_range(
    key_lo: jax.Array, key_hi: jax.Array, block_k: int, num_splits: int, split: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Key blocks [lo, hi) that split `split` of `num_splits` processes; empty when no keys."""
    first = lax.div(key_lo, jnp.int32(block_k))
    end = jnp.where(key_hi > key_lo, lax.div(key_hi + (block_k - 1), jnp.int32(block_k)), first)
    per_split = lax.div(end - first + (num_splits - 1), jnp.int32(num_splits))
    lo = first + split * per_split
    return lo, jnp.minimum(end, lo + per_split)


def attention_mask(
    row_query: jax.Array,  # [rows, 1] int32, query index of each row
    key_pos: jax.Array,  # [1, block_k] int32, position of each key
    length: jax.Array,  # [] int32
    query_len: jax.Array,  # [] int32
    sliding_window: int | None,
    attention_chunk: int | None = None,
) -> jax.Array:
    """[rows, block_k] bool: causal, inside the window or the query's chunk, and the row is a real query."""
    query_pos = length - query_len + row_query
    mask = (row_query < query_len) & (key_pos <= query_pos)
    if sliding_window is not None:
        mask = mask & (query_pos - key_pos < sliding_window)
    if attention_chunk is not None:
        mask = mask & (key_pos >= query_pos - lax.rem(jnp.maximum(query_pos, 0), jnp.int32(attention_chunk)))
    return mask


def dot(a: jax.Array, b: jax.Array, *, transpose_b: bool = False) -> jax.Array:
    """a @ b (or a @ b.T) accumulated in f32; f32 inputs use full precision, not tf32/bf16."""
    contract_b = 1 if transpose_b else 0
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return lax.dot_general(
        a, b, (((1,), (contract_b,)), ((), ())),
        precision=precision, preferred_element_type=jnp.float32,
    )


def scaled_logits(
    q: jax.Array,  # [rows, head_dim] compute dtype
    k: jax.Array,  # [block_k, head_dim] compute dtype
    k_scale: jax.Array | None,  # [1, block_k] f32 int8 dequantization scale
    params: AttentionParams,
) -> jax.Array:
    """[rows, block_k] f32 logits: q.k * sm_scale (* k_scale), then the optional soft cap."""
    logits = dot(q, k, transpose_b=True)
    if k_scale is not None:
        # Per-token scale factors out of the dot: q.(s * k) = s * (q.k).
        logits = logits * k_scale
    logits = logits * params.sm_scale
    if params.soft_cap is not None:
        logits = params.soft_cap * jnp.tanh(logits / params.soft_cap)
    return logits


def alibi_bias(
    slopes: jax.Array,  # [rows, 1] f32 ALiBi slope of each row's head
    row_query: jax.Array,  # [rows, 1] int32, query index of each row
    key_pos: jax.Array,  # [1, block_k] int32, position of each key
    length: jax.Array,  # [] int32
    query_len: jax.Array,  # [] int32
) -> jax.Array:
    """[rows, block_k] f32 ALiBi bias slope * (key position - query position): 0 on the diagonal, more negative
    further back (BLOOM, MPT). Relative, not slope * key position: the same softmax, with small values where
    the keys that matter are."""
    query_pos = length - query_len + row_query
    return slopes * (key_pos - query_pos).astype(jnp.float32)


def online_softmax_step(
    carry: tuple[jax.Array, jax.Array, jax.Array],  # o [rows, d] f32, m [rows, 1], l [rows, 1]
    logits: jax.Array,  # [rows, block_k] f32
    mask: jax.Array,  # [rows, block_k] bool
    v: jax.Array,  # [block_k, head_dim] compute dtype, zero where the key is invalid
    v_scale: jax.Array | None,  # [1, block_k] f32, zero where the key is invalid
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Fold one block of keys into the running (output, max, denominator)."""
    o_prev, m_prev, l_prev = carry
    logits = jnp.where(mask, logits, MASK_VALUE)
    m_next = jnp.maximum(m_prev, jnp.max(logits, axis=1, keepdims=True))
    alpha = jnp.exp(m_prev - m_next)
    # Explicit zero, not exp(MASK - m): a row with no valid key yet has m == MASK.
    p = jnp.where(mask, jnp.exp(logits - m_next), 0.0)
    l_next = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
    if v_scale is not None:
        p = p * v_scale
    o_next = alpha * o_prev + dot(p.astype(v.dtype), v)
    return o_next, m_next, l_next


def initial_carry(num_rows: int, head_dim: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Empty online-softmax state for `num_rows` rows."""
    return (
        jnp.zeros((num_rows, head_dim), jnp.float32),
        jnp.full((num_rows, 1), MASK_VALUE, jnp.float32),
        jnp.zeros((num_rows, 1), jnp.float32),
    )


def sink_carry(sinks: jax.Array, head_dim: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Online-softmax state that has already seen each row's sink (sinks [rows, 1] f32): a key whose
    logit is the sink and whose value is zero, so o stays 0 and l starts at exp(sink - sink) = 1."""
    rows = sinks.shape[0]
    return jnp.zeros((rows, head_dim), jnp.float32), sinks, jnp.ones((rows, 1), jnp.float32)


def normalize(o: jax.Array, l: jax.Array) -> jax.Array:
    """o / l, and exactly zero for rows that attended nothing (padding rows)."""
    return jnp.where(l > 0.0, o / jnp.where(l > 0.0, l, 1.0), 0.0)


def combine_splits(
    o: jax.Array,  # [..., splits, rows, head_dim] f32 unnormalized partial outputs
    m: jax.Array,  # [..., splits, rows, 1] f32 running maxima
    l: jax.Array,  # [..., splits, rows, 1] f32 partial denominators
    sinks: jax.Array | None = None,  # [..., rows, 1] f32 attention-sink logit of each row
) -> jax.Array:
    """Merge split-K partial results into [..., rows, head_dim] f32.

    A row's sink is one more key with a zero value: it joins the max and adds exp(sink - max) to the
    denominator only (a padding row, with no keys, stays zero).
    """
    m_all = jnp.max(m, axis=-3, keepdims=True)
    if sinks is not None:
        m_all = jnp.maximum(m_all, sinks[..., None, :, :])
    weight = jnp.exp(m - m_all)  # empty splits have m == MASK and weigh ~0
    o_sum = jnp.sum(o * weight, axis=-3)
    l_sum = jnp.sum(l * weight, axis=-3)
    if sinks is not None:
        l_sum = l_sum + jnp.exp(sinks - m_all[..., 0, :, :])
    return normalize(o_sum, l_sum)


def head_rows(values: jax.Array, num_kv_heads: int, max_q: int, num_rows: int) -> jax.Array:
    """A value per query head [q_heads] (sink logits, ALiBi slopes) laid out as the query rows are:
    [kv_heads, num_rows, 1] f32 (row = query * group + h)."""
    per_kv = values.astype(jnp.float32).reshape(num_kv_heads, -1)  # [kv_heads, group]
    rows = jnp.tile(per_kv, (1, max_q))
    return jnp.pad(rows, ((0, 0), (0, num_rows - rows.shape[1])))[..., None]
