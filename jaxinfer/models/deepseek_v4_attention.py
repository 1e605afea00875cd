"""DeepSeek-V4's attention (transformers' DeepseekV4Attention): one shared K=V head over a sliding window, plus
compressed entries on CSA and HCA layers, a learned sink per head and a grouped low-rank output projection.

- Query: q_a_proj, its RMSNorm, q_b_proj to H heads of K, each head RMS-normed without a weight; key = value: kv_proj
  and its RMSNorm. The last qk_rope_head_dim dims of both rotate in adjacent pairs (the "main" rope on sliding-only
  layers, the "compress" one elsewhere); the output's rotate back (-sin) at the query's position, since the value
  carried its key's rotation.
- A query sees the `sliding_window` raw tokens up to itself, and the compressed entries of the blocks complete at
  its position (models/compressed_entries): every one on an HCA layer; on a CSA layer the `index_topk` its lightning
  indexer scores highest (per head relu(q . k) / sqrt(I), weighted by weights_proj(h) / sqrt(heads), summed), the
  indexer keeping its own entries of index_head_dim beside the layer's.
- Output: heads in `o_groups` groups, each projected to o_lora_rank (o_a_proj, one matrix per group), then o_b_proj.

The cache is token rows (models/token_rows): a layer's row is [kv | raw compressor C, Z | raw indexer C, Z | entry |
index entry] (the parts the layer has). The raw parts and the entries of blocks a step completes are written first,
then read back, so whole sequences and engine steps (chunked prefill splitting a block, decode, prefix caching,
preemption) run one path; a query gathers its window's rows and the entry rows (each block's last token) of its
sequence's pages, in blocks of query tokens (`sparse_latent_attention.block_tokens`). XLA only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.config.deepseek_v4 import CSA, HCA, SLIDING, DeepseekV4Fields
from jaxinfer.config.model import ModelConfig
from jaxinfer.models.blocked_attention import NEG_INF
from jaxinfer.models.compressed_entries import block_entries, rotate_last
from jaxinfer.models.layers import linear
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import CosSin, cos_sin
from jaxinfer.models.sparse_latent_attention import block_tokens
from jaxinfer.models.token_rows import TokenRows, layer_rows, write_rows


@dataclasses.dataclass(frozen=True)
class RowLayout:
    """The columns of one layer's token row: widths K (head), I (index head), compression rate m (0: sliding only)."""

    head: int
    rate: int
    overlap: bool  # CSA: two series per token (c = 2)
    index: int  # I on a CSA layer, else 0

    @property
    def raw(self) -> int:
        """The raw columns: kv, then the compressor's C and Z (c * K each), then the indexer's (2I each)."""
        c = 2 if self.overlap else 1
        return self.head + (2 * c * self.head if self.rate else 0) + 4 * self.index

    @property
    def width(self) -> int:
        """Values a row holds: the raw ones, then the entry (K) and index entry (I) on compressed layers."""
        return self.raw + (self.head + self.index if self.rate else 0)

    def compressor(self) -> tuple[int, int, int]:
        """(first value column, first gate column, their width) of the compressor's raw parts."""
        c = 2 if self.overlap else 1
        return self.head, self.head + c * self.head, c * self.head

    def indexer(self) -> tuple[int, int, int]:
        """(first value column, first gate column, their width) of the indexer's raw parts."""
        start = self.head + 4 * self.head
        return start, start + 2 * self.index, 2 * self.index


def row_layout(fields: DeepseekV4Fields, kind: str, head: int) -> RowLayout:
    """The row of a layer of `kind` (one of config/deepseek_v4's LAYER_KINDS), K = head."""
    rate = {SLIDING: 0, CSA: fields.csa_rate, HCA: fields.hca_rate}[kind]
    return RowLayout(head, rate, kind == CSA, fields.index_dim if kind == CSA else 0)


def layer_kind(lw: Any) -> str:
    """A layer's kind by its weights (a one-layer call is handed layer 0: its index says nothing)."""
    return SLIDING if lw.comp_kv is None else CSA if lw.index_kv is not None else HCA


def _entries_written(cfg: ModelConfig, lw: Any, cache: Any, layer: int, raw: jax.Array, rows_of: RowLayout,
                     positions: jax.Array) -> Any:
    """The cache with each step token's row [raw | its block's entry | index entry] (zeros where it ends no block),
    the raw parts of the step already written and read back. Only the tokens ending a block pool one: a run of L
    consecutive positions ends at most L // m + 1 blocks, so at most N // m + (the step's sequences) do."""
    B, T, _ = raw.shape
    N, m, overlap, eps, K = B * T, rows_of.rate, rows_of.overlap, cfg.rms_norm_eps, rows_of.head
    rows = layer_rows(cache, layer, B, T, rows_of.width)
    flat = positions.reshape(-1)
    count = min(N, N // m + rows.keys.tables.shape[0])
    enders = jnp.nonzero((flat >= 0) & ((flat + 1) % m == 0), size=count, fill_value=N)[0]  # N: no such token
    kept = jnp.minimum(enders, N - 1)
    ends = jnp.where(enders < N, flat[kept], -1)
    span = (2 if overlap else 1) * m
    slots = ends[:, None] - span + 1 + jnp.arange(span)  # the slots of each block, its last token last
    rope = cos_sin((ends - m + 1)[None], cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling)
    gathered = rows.gather(rows.token_rows[kept], slots, K, rows_of.raw)  # every raw part past kv, read at once

    def entry(columns: tuple[int, int, int], bias: jax.Array, norm: jax.Array) -> jax.Array:
        value, gate, width = columns[0] - K, columns[1] - K, columns[2]
        values, gates = gathered[..., value:value + width], gathered[..., gate:gate + width]
        return block_entries(values, gates, bias, norm, ends, rope, overlap, eps).astype(raw.dtype)

    entries = [entry(rows_of.compressor(), lw.comp_bias, lw.comp_norm)]
    if overlap:
        entries.append(entry(rows_of.indexer(), lw.index_bias, lw.index_norm))
    entries = jnp.concatenate(entries, -1)
    placed = jnp.zeros((N + 1, entries.shape[-1]), raw.dtype).at[enders].set(entries)[:N]  # row N: the fill's
    return write_rows(cache, layer, jnp.concatenate([raw.reshape(N, -1), placed], -1).reshape(B, T, -1), positions)


def _chosen_entries(index_q: jax.Array, index_w: jax.Array, keys: jax.Array, complete: jax.Array,
                    topk: int) -> tuple[jax.Array, jax.Array]:
    """A CSA query's kept entries: index heads [n, Hi, I] and weights [n, Hi] over the entries' index keys
    [n, C, I], complete [n] the entries each sees -> the top `topk` entries [n, k] and which are seen [n, k]."""
    dots = jnp.einsum("nhi,nci->nhc", index_q.astype(jnp.float32), keys.astype(jnp.float32))
    scores = jnp.einsum("nhc,nh->nc", jax.nn.relu(dots) * index_q.shape[-1] ** -0.5, index_w.astype(jnp.float32))
    seen = jnp.arange(keys.shape[1]) < complete[:, None]
    top = jax.lax.top_k(jnp.where(seen, scores, -jnp.inf), min(topk, keys.shape[1]))[1]
    return top, top < complete[:, None]


def _attend_block(q: jax.Array, index_q: jax.Array | None, index_w: jax.Array | None, positions: jax.Array,
                  token_rows: jax.Array, rows: TokenRows, rows_of: RowLayout, sinks: jax.Array,
                  cfg: ModelConfig) -> jax.Array:
    """n query tokens (q [n, H, K], positions [n], -1 padding) over their window's rows and the entries they see:
    [n, H, K] float32."""
    K, m, window = rows_of.head, rows_of.rate, cfg.deepseek_v4.sliding_window
    near = positions[:, None] - window + 1 + jnp.arange(window)
    keys = [rows.gather(token_rows, near, 0, K)]
    valid = [near >= 0]
    if m:
        entry = rows_of.raw
        count = rows.capacity // m
        complete = (positions + 1) // m
        if rows_of.overlap:
            ends = jnp.broadcast_to(jnp.arange(count) * m + m - 1, (positions.shape[0], count))
            index_keys = rows.gather(token_rows, ends, entry + K, entry + K + rows_of.index)
            chosen, seen = _chosen_entries(index_q, index_w, index_keys, complete, cfg.deepseek_v4.index_topk)
        else:
            chosen = jnp.broadcast_to(jnp.arange(count), (positions.shape[0], count))
            seen = chosen < complete[:, None]
        keys.append(rows.gather(token_rows, chosen * m + m - 1, entry, entry + K))
        valid.append(seen)
    keys = jnp.concatenate(keys, axis=1).astype(jnp.float32)  # [n, S, K]: keys and values alike
    valid = jnp.concatenate(valid, axis=1) & (positions >= 0)[:, None]
    scores = jnp.einsum("nhk,nsk->nhs", q.astype(jnp.float32), keys) * K**-0.5
    scores = jnp.where(valid[:, None], scores, NEG_INF)
    sink = jnp.broadcast_to(sinks.astype(jnp.float32)[None, :, None], (*scores.shape[:2], 1))
    probs = jax.nn.softmax(jnp.concatenate([scores, sink], -1), axis=-1)[..., :-1]
    return jnp.einsum("nhs,nsk->nhk", probs, keys)


def _blocked(fn: Any, tensors: tuple[jax.Array | None, ...], positions: jax.Array, rows: TokenRows,
             heads: int) -> jax.Array:
    """fn(*per-token tensors, positions, token rows) over blocks of the step's query tokens: [B, T, ...]."""
    B, T = positions.shape
    N = B * T
    block = block_tokens(N, rows.capacity, heads)
    count = -(-N // block)

    def blocks(x: jax.Array | None, fill: int = 0) -> jax.Array | None:
        if x is None:
            return None
        x = jnp.pad(x.reshape(N, *x.shape[2:]), [(0, count * block - N)] + [(0, 0)] * (x.ndim - 2),
                    constant_values=fill)
        return x.reshape(count, block, *x.shape[1:])

    parts = (*(blocks(x) for x in tensors), blocks(positions, -1), blocks(rows.token_rows.reshape(B, T)))
    out = jax.lax.map(lambda part: fn(*part), parts)
    return out.reshape(count * block, *out.shape[2:])[:N].reshape(B, T, *out.shape[2:])


def v4_attention(cfg: ModelConfig, h: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array,
                 rope: CosSin) -> tuple[jax.Array, Any]:
    """Attention of the normed h [B, T, D] (rope: this layer's tables at the step's positions): [B, T, D] and the
    cache with the step's rows (and the entries of the blocks it completes) written."""
    B, T, _ = h.shape
    eps, fields = cfg.rms_norm_eps, cfg.deepseek_v4
    H, K = lw.q_b.shape[1:]
    rows_of = row_layout(fields, layer_kind(lw), K)
    q_low = rms_norm(linear(h, lw.q_a), lw.q_a_norm, eps)
    q = linear(q_low, lw.q_b)
    q32 = q.astype(jnp.float32)
    q = (q32 * jax.lax.rsqrt(jnp.mean(q32 * q32, axis=-1, keepdims=True) + eps)).astype(q.dtype)
    q = rotate_last(q, *rope)
    kv = rotate_last(rms_norm(linear(h, lw.kv), lw.kv_norm, eps)[:, :, None], *rope)[:, :, 0]
    raw = [kv]
    if rows_of.rate:
        raw += [linear(h, lw.comp_kv), linear(h, lw.comp_gate)]
    if rows_of.overlap:
        raw += [linear(h, lw.index_kv), linear(h, lw.index_gate)]
    raw = jnp.concatenate(raw, -1)
    pad = jnp.zeros((B, T, rows_of.width - rows_of.raw), raw.dtype)
    cache = write_rows(cache, layer, jnp.concatenate([raw, pad], -1), positions)
    if rows_of.rate:
        cache = _entries_written(cfg, lw, cache, layer, raw, rows_of, positions)
    rows = layer_rows(cache, layer, B, T, rows_of.width)
    index_q = index_w = None
    if rows_of.overlap:
        Hi, I = fields.index_heads, fields.index_dim
        index_q = rotate_last(linear(q_low, lw.index_q).reshape(B, T, Hi, I),
                              *cos_sin(positions, cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling))
        index_w = linear(h, lw.index_weights).astype(jnp.float32) * Hi**-0.5
    attend = lambda *part: _attend_block(*part, rows, rows_of, lw.sinks, cfg)  # noqa: E731
    out = _blocked(attend, (q, index_q, index_w), positions, rows, max(H, fields.index_heads))
    cos, sin = rope
    out = rotate_last(out.astype(h.dtype), cos, -sin)
    G = fields.o_groups
    grouped = jnp.einsum("btgi,gio->btgo", out.reshape(B, T, G, H * K // G), lw.o_a.astype(out.dtype),
                         precision=jax.lax.Precision.HIGHEST)
    return linear(grouped.reshape(B, T, -1), lw.o_b), cache

