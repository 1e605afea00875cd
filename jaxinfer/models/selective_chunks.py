"""Mamba-1's selective scan in chunks over a step's packed tokens: the prefill form for accelerators.

The scan (mamba1_mixer.token_step through models/slot_scan) runs h_t = a_t * h_{t-1} + u_t one token per
iteration, with a_t = exp(dt_t A) and u_t = dt_t x_t B_t, both [I, N], and reads y_t = h_t C_t. Every channel
decays each of its N state entries at its own rate (A is [I, N]), so Mamba2's SSD (one scalar decay per head and
token, chunks as matmuls: models/ssd_chunks) does not carry over: its within-chunk decay matrix would be
[Q, Q, I, N]. The recurrence is linear, though, and its (a, u) pairs compose associatively: (a1, u1) then (a2, u2)
is (a1 a2, a2 u1 + u2). Within a chunk of Q tokens `lax.associative_scan` composes them in 2 log2(Q) levels of
elementwise work over [Q, I, N] (the same products as the scan, no exp of differences that could overflow); a
fixed-trip `lax.scan` over the T / Q chunks carries the chunk's last state into the next. T dependent steps become
T / Q of them, each a few wide elementwise kernels.

Requests stay apart through their segments (ssd_chunks.segments: one request's run of tokens): a segment's first
token gets a = 0, so nothing before it leaks in, and u plus a times its slot's pool state where it continues its
request (position > 0; zeros from position 0). Padding tokens get (0, 0): they read and write nothing. Each
segment's last token's state is written to its slot as the chunk that holds it ends.

`chunked_linear_scan` is that machinery over whatever (a, u) a caller makes per chunk: Mamba-1's
(`chunked_selective_scan`), and RecurrentGemma's RG-LRU (models/rg_lru: a and u [Q, W, 1], one entry per channel).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.ssd_chunks import Segments

# Float32 elements of one [Q, I, N] array a chunk works on (16 MiB): the associative scan keeps a few such arrays
# live, so Q shrinks as I * N grows (FalconMamba-7B's 8192 x 16: Q = 32) rather than the memory growing with it.
CHUNK_ELEMENTS = 1 << 22


def chunk_tokens(ss: StateSpace, budget: int = CHUNK_ELEMENTS) -> int:
    """The chunk Q: the largest power of two (the scan's levels halve evenly) with Q * I * N <= budget, at most
    ss.chunk_size and at least 1."""
    fits = max(1, min(ss.chunk_size, budget // (ss.inner * ss.state_size)))
    return 1 << (fits.bit_length() - 1)


def _compose(earlier: tuple[jax.Array, jax.Array], later: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, ...]:
    """(a1, u1) then (a2, u2): the map h -> a2 (a1 h + u1) + u2."""
    return earlier[0] * later[0], later[0] * earlier[1] + later[1]


def _padded(v: jax.Array, total: int, value: int | float = 0) -> jax.Array:
    return jnp.pad(v, [(0, total - v.shape[0])] + [(0, 0)] * (v.ndim - 1), constant_values=value)


Terms = Callable[..., tuple[jax.Array, jax.Array]]  # a chunk's inputs [Q, ...] -> (a, u) [Q, I, N]
Readout = Callable[..., jax.Array]  # (states [Q, I, N], a chunk's inputs [Q, ...]) -> y [Q, ...]


def chunked_linear_scan(
    terms: Terms, readout: Readout, inputs: tuple[jax.Array, ...], ssm_pool: jax.Array, slots: jax.Array,
    positions: jax.Array, seg: Segments, chunk: int,
) -> tuple[jax.Array, jax.Array]:
    """h_t = a_t h_{t-1} + u_t through each token's slot state: `terms` makes a chunk's (a, u) [Q, I, N] from its
    inputs (each [T, ...] here), `readout` its outputs from the states; the pool [S, I, 1, N], the step's slots and
    positions [T] (-1 padding) and segments -> (the pool with each segment's final state written to its slot, y
    [T, ...]); float32, T padded to a multiple of `chunk` inside."""
    T, num_slots = slots.shape[0], ssm_pool.shape[0]
    nc = -(-T // chunk)
    total = nc * chunk
    index = jnp.arange(T)
    opens = seg.real & (seg.start == index)
    closes = seg.real & (jnp.append(seg.start[1:], -1) != seg.start)  # the next token is another segment's
    continued = opens & (positions > 0)
    keeps = seg.real & ~opens  # tokens whose state continues the one before them

    def chunked(v: jax.Array, fill: int = 0) -> jax.Array:  # [T, ...] -> [nc, Q, ...]
        return _padded(v, total, fill).reshape(nc, chunk, *v.shape[1:])

    marks = tuple(chunked(v) for v in (slots, continued, keeps))
    writes = chunked(jnp.where(closes, slots, num_slots), num_slots)  # past the slots: dropped

    def one_chunk(carry: tuple[jax.Array, jax.Array], chunk_inputs: tuple[jax.Array, ...]):
        h, pool = carry  # h [I, N]: the state after the previous chunk's last token
        slots, continued, keeps, writes, *xs = chunk_inputs
        decay, u = terms(*xs)  # [Q, I, N] each
        u = u + jnp.where(continued[:, None, None], decay * pool[slots, :, 0], 0.0)  # a continuing segment's start
        decay = jnp.where(keeps[:, None, None], decay, 0.0)
        decays, states = jax.lax.associative_scan(_compose, (decay, u))
        states = states + decays * h
        pool = pool.at[writes].set(states[:, :, None], mode="drop")
        return (states[-1], pool), readout(states, *xs)

    zero = jnp.zeros(ssm_pool.shape[1:2] + ssm_pool.shape[3:], jnp.float32)
    (_, pool), y = jax.lax.scan(one_chunk, (zero, ssm_pool), (*marks, writes, *(chunked(v) for v in inputs)))
    return pool, y.reshape(total, *y.shape[2:])[:T]


def chunked_selective_scan(
    x: jax.Array, dt: jax.Array, b: jax.Array, c: jax.Array, a: jax.Array, ssm_pool: jax.Array, slots: jax.Array,
    positions: jax.Array, seg: Segments, chunk: int,
) -> tuple[jax.Array, jax.Array]:
    """x and dt [T, I] (dt after softplus), B and C [T, G, N] (G heads of I / G channels each reading their own:
    Zamba's; 1 else), A [I, N] (negative), the pool [S, I, 1, N], the step's slots and positions [T] (-1 padding)
    and segments -> (the pool with each segment's final state written to its slot, y [T, I] without the D skip);
    `chunked_linear_scan` with a = exp(dt A), u = dt x B, y = C h."""

    def terms(x: jax.Array, dt: jax.Array, b: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
        Q, G, N = b.shape
        return jnp.exp(dt[:, :, None] * a), ((dt * x).reshape(Q, G, -1, 1) * b[:, :, None, :]).reshape(Q, -1, N)

    def readout(states: jax.Array, x: jax.Array, dt: jax.Array, b: jax.Array, c: jax.Array) -> jax.Array:
        Q, G, N = c.shape
        return jnp.einsum("qgpn,qgn->qgp", states.reshape(Q, G, -1, N), c).reshape(Q, -1)

    return chunked_linear_scan(terms, readout, (x, dt, b, c), ssm_pool, slots, positions, seg, chunk)
