"""Mamba2's recurrence in chunks (SSD, "state space duality", Dao & Gu 2024) over a step's packed tokens.

The scan (mamba2_mixer.packed_scan) runs h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t one token
per iteration. Here the T tokens are cut into chunks of Q: within a chunk y = (L * C B^T) (dt x), L the
cumulative-decay matrix, masked so that a token only sees earlier tokens of its own segment; across chunks a
scan of T / Q steps passes the state of each chunk's last segment on to the next. A segment is one request's
run of tokens (same slot, consecutive positions): tokens of different requests never mix, and a segment
that continues a request (first position > 0) starts from its slot's pool state, one that starts at
position 0 from zeros. Each segment's final state is returned for its slot.

The engine packs each request's tokens of a step as one contiguous run, so a slot has at most one segment
per step and the segments number at most the pool's slots: that bound sizes the per-segment arrays.
Everything is float32, shapes are static (T padded to a multiple of Q inside), and the only loop is the
fixed-trip scan over chunks: no host round trip, nothing data-dependent in control flow.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Segments(NamedTuple):
    """Where each packed token's segment starts, and each real segment's first and last token."""

    start: jax.Array  # [T] int32 flat index of the token's segment's first token (a padding token: its own)
    real: jax.Array  # [T] bool: position >= 0
    first: jax.Array  # [R] int32 the r-th real segment's first token (0 past the last segment)
    last: jax.Array  # [R] int32 its last token
    valid: jax.Array  # [R] bool: r < the number of real segments


def segments(slots: jax.Array, positions: jax.Array, bound: int) -> Segments:
    """The segments of T packed tokens (slots [T], positions [T], -1 padding), at most `bound` of them real."""
    index = jnp.arange(slots.shape[0])
    real = positions >= 0
    prev_slot, prev_position = jnp.roll(slots, 1), jnp.roll(positions, 1)
    continues = (index > 0) & real & (prev_slot == slots) & (prev_position >= 0) & (positions == prev_position + 1)
    start = jax.lax.cummax(jnp.where(continues, 0, index))
    opens = real & ~continues
    closes = real & ~jnp.append(continues[1:], False)
    ordinal = jnp.cumsum(opens) - 1  # a real token's segment's rank among the real segments
    first = jnp.zeros(bound, jnp.int32).at[jnp.where(opens, ordinal, bound)].set(index, mode="drop")
    last = jnp.zeros(bound, jnp.int32).at[jnp.where(closes, ordinal, bound)].set(index, mode="drop")
    return Segments(start, real, first, last, jnp.arange(bound) < jnp.sum(opens))


def conv_windows(conv_pool: jax.Array, xbc: jax.Array, slots: jax.Array, positions: jax.Array,
                 seg: Segments) -> jax.Array:
    """Each token's causal conv window [T, K, C] (oldest first, the token last): its segment's earlier tokens,
    before them its slot's conv state [S, K-1, C] (zeros for a segment starting at position 0)."""
    K = conv_pool.shape[1] + 1
    offset = jnp.arange(xbc.shape[0]) - seg.start  # tokens before it in its segment
    fresh = positions[seg.start] == 0
    rows = []
    for j in range(K):
        back = K - 1 - j
        earlier = jnp.pad(xbc, ((back, 0), (0, 0)))[: xbc.shape[0]]
        stored = conv_pool[slots, jnp.minimum(j + offset, K - 2)]  # the state's row j + offset when back > offset
        stored = jnp.where(fresh[:, None], 0.0, stored)
        rows.append(jnp.where((offset >= back)[:, None], earlier, stored))
    return jnp.stack(rows, axis=1)


def depthwise_conv(conv_pool: jax.Array, weight: jax.Array, bias: jax.Array | None, x: jax.Array, slots: jax.Array,
                   positions: jax.Array, seg: Segments) -> tuple[jax.Array, jax.Array]:
    """The causal depthwise conv (weight [C, 1, K] as HF stores it, bias [C] or None) over a step's flat x [T, C],
    each token's window continuing its slot's state: (its float32 output [T, C], before any activation; the pool
    with each segment's last K - 1 inputs written to its slot)."""
    num_slots = conv_pool.shape[0]
    windows = conv_windows(conv_pool, x.astype(jnp.float32), slots, positions, seg)  # [T, K, C]
    mixed = jnp.sum(windows * weight[:, 0].T.astype(jnp.float32), axis=-2)  # K products per channel
    if bias is not None:
        mixed = mixed + bias.astype(jnp.float32)
    target = jnp.where(seg.valid, slots[seg.first], num_slots)  # past the segments: dropped
    return mixed, conv_pool.at[target].set(windows[seg.last, 1:], mode="drop")


def _padded(v: jax.Array, total: int) -> jax.Array:
    return jnp.pad(v, [(0, total - v.shape[0])] + [(0, 0)] * (v.ndim - 1))


def chunked_ssd(
    x: jax.Array, b: jax.Array, c: jax.Array, dt: jax.Array, a: jax.Array, ssm_pool: jax.Array, slots: jax.Array,
    positions: jax.Array, seg: Segments, chunk: int,
) -> tuple[jax.Array, jax.Array]:
    """x [T, H, P], B and C [T, G, N], dt [T, H] (after softplus), A [H] (negative), the pool [S, H, P, N] ->
    (y [T, H, P] without the D skip, each real segment's final state [R, H, P, N]); float32.

    Chunked arrays are head-major ([chunks, H, Q, ...]): each head's products are plain batched matmuls."""
    T, H, P = x.shape
    G, N = b.shape[1:]
    J, nc = H // G, -(-T // chunk)
    total = nc * chunk
    dt = jnp.where(seg.real[:, None], dt, 0.0)  # padding adds nothing to any state
    x, b, c, dt = (_padded(v, total) for v in (x, b, c, dt))
    log_decay = dt * a
    start = jnp.concatenate([seg.start, jnp.arange(T, total)])  # padded tokens: their own segments
    real = _padded(seg.real, total)
    continued = real & (_padded(positions, total)[start] > 0)  # the segment starts from its slot's state
    home = _padded(slots, total)[start]

    def heads_first(v: jax.Array) -> jax.Array:  # [total, A, ...] -> [nc, A, Q, ...]
        return jnp.swapaxes(v.reshape(nc, chunk, *v.shape[1:]), 1, 2)

    xc, bc, cc, dtc = heads_first(x), heads_first(b), heads_first(c), heads_first(dt)
    startc = start.reshape(nc, chunk)
    cum_flat = jnp.cumsum(log_decay.reshape(nc, chunk, H), axis=1).reshape(total, H)  # within chunks, inclusive
    cum = heads_first(cum_flat)  # [nc, H, Q]
    cum_before = cum_flat - log_decay  # exclusive: the decay a segment's first token applies to its entry state

    def pool_entry(e: jax.Array) -> jax.Array:
        """[M] tokens -> [M, H, P, N]: the slot state their segment started from, decayed to them, where that
        segment began in the token's own chunk (earlier chunks pass it on through the chunk scan)."""
        s = start[e]
        applies = continued[s] & (s >= e // chunk * chunk)
        decay = jnp.where(applies[:, None], jnp.exp(cum_flat[e] - cum_before[s]), 0.0)
        return decay[:, :, None, None] * ssm_pool[home[s]]

    def local_state(e: jax.Array) -> jax.Array:
        """[M] tokens -> [M, H, P, N]: their segment's inputs in their chunk up to them, decayed to them."""
        ch, off = e // chunk, e % chunk
        mine = (startc[ch] == start[e][:, None]) & (jnp.arange(chunk) <= off[:, None])  # [M, Q]
        exponent = jnp.where(mine[:, None], cum_flat[e][:, :, None] - cum[ch], -jnp.inf)  # [M, H, Q]
        weighted = (jnp.exp(exponent) * dtc[ch])[..., None] * xc[ch]  # [M, H, Q, P]
        state = jnp.einsum("mgjqp,mgqn->mgjpn", weighted.reshape(-1, G, J, chunk, P), bc[ch])
        return state.reshape(-1, H, P, N) + pool_entry(e)

    # The chunk scan: each chunk's last segment's state after it, carried on when that segment began earlier.
    ends = jnp.arange(nc) * chunk + chunk - 1
    last_start = startc[:, -1]
    prev_last = jnp.concatenate([jnp.full((1,), -1, start.dtype), last_start[:-1]])
    carries = last_start == prev_last

    def pass_on(h, chunk_in):
        own, carry, decay = chunk_in
        return own + jnp.where(carry, decay, 0.0)[:, None, None] * h, h

    zero = jnp.zeros((H, P, N), jnp.float32)
    _, entering = jax.lax.scan(pass_on, zero, (local_state(ends), carries, jnp.exp(cum[:, :, -1])))  # [nc, H, P, N]

    # Outputs: within each chunk (segment-masked), from the state entering the chunk, from slot states.
    causal = jnp.tril(jnp.ones((chunk, chunk), bool))
    same = (startc[:, :, None] == startc[:, None, :]) & causal  # [nc, Q, Q]
    exponent = jnp.where(same[:, None], cum[..., :, None] - cum[..., None, :], -jnp.inf)  # [nc, H, Q, Q]
    scores = jnp.einsum("cgqn,cgrn->cgqr", cc, bc)[:, :, None] * jnp.exp(exponent).reshape(nc, G, J, chunk, chunk)
    scores = scores.reshape(nc, H, chunk, chunk) * dtc[:, :, None, :]
    y = jnp.einsum("chqr,chrp->chqp", scores, xc)
    from_prev = jnp.where((startc == prev_last[:, None])[:, None], jnp.exp(cum), 0.0)  # [nc, H, Q]
    inter = jnp.einsum("cgqn,cgjpn->cgjqp", cc, entering.reshape(nc, G, J, P, N)).reshape(nc, H, chunk, P)
    y = y + inter * from_prev[..., None]
    y = y + _pool_outputs(seg, start, continued, home, cum, cum_before, cc, ssm_pool, chunk)
    y = jnp.swapaxes(y, 1, 2).reshape(total, H, P)

    ch = seg.last // chunk
    carried = jnp.where((start[seg.last] == prev_last[ch])[:, None], jnp.exp(cum_flat[seg.last]), 0.0)
    final = local_state(seg.last) + carried[:, :, None, None] * entering[ch]
    return y[:T], final


def _pool_outputs(seg: Segments, start: jax.Array, continued: jax.Array, home: jax.Array, cum: jax.Array,
                  cum_before: jax.Array, cc: jax.Array, ssm_pool: jax.Array, chunk: int) -> jax.Array:
    """[nc, H, Q, P]: each continuing segment's slot state read by its tokens in the chunk it starts in."""
    nc, G = cc.shape[:2]
    H, P, N = ssm_pool.shape[1:]
    first = seg.first
    ch = first // chunk
    applies = seg.valid & continued[first]
    entry = jnp.where(applies[:, None, None, None], ssm_pool[home[first]], 0.0).reshape(-1, G, H // G, P, N)
    mine = (start.reshape(nc, chunk)[ch] == first[:, None])[:, None]  # [R, 1, Q]
    decay = jnp.exp(jnp.where(mine, cum[ch] - cum_before[first][:, :, None], -jnp.inf))  # [R, H, Q]
    out = jnp.einsum("rgqn,rgjpn->rgjqp", cc[ch], entry).reshape(-1, H, chunk, P) * decay[..., None]
    return jnp.zeros((nc, H, chunk, P)).at[ch].add(out)
