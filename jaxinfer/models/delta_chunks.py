"""The gated delta rule in chunks over a step's packed tokens (Gated DeltaNet's prefill form on accelerators).

The scan (gated_deltanet.packed_scan) runs, per value head, S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T)
+ beta_t v_t k_t^T and y_t = S_t q_t one token per iteration. Here the T tokens are cut into chunks of Q, as
transformers' `torch_chunk_gated_delta_rule` (and FLA) do: within a chunk the delta-rule updates condense into
one unit lower-triangular solve (the UT transform: U = T (beta v), W = T (beta k exp(G))) and matmuls; a
fixed-trip scan over the T / Q chunks passes on the state of each chunk's last segment. As in models/ssd_chunks
(whose `segments` and `conv_windows` this reads), a segment is one request's run of tokens: every pairwise term
is masked to the segment, a segment continuing a request starts from its slot's pool state (zeros at position
0), and each segment's final state is returned for its slot. The initial state S0 enters linearly: the
new values are U - S0 W and a token reads S0 r_t beside its in-chunk terms, so slot states are read per segment,
never gathered per token. Everything is float32 with static shapes.

The decay is one per token and head (Gated DeltaNet: g [T, H]) or one per key channel (Kimi Delta Attention:
g [T, H, N], S_t = S_{t-1} diag(exp(g_t)) in the [value, key] layout): the same algebra with G the cumulative
log decay per channel, the pairwise ratios exp(G_i - G_j) then [Q, Q, N] per head and chunk, computed one chunk
at a time (lax.map) so they never exist for every chunk at once; both masked before the exp, so never overflow.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.models.ssd_chunks import Segments


def _padded(v: jax.Array, total: int) -> jax.Array:
    return jnp.pad(v, [(0, total - v.shape[0])] + [(0, 0)] * (v.ndim - 1))


def _advance(s0: jax.Array, w: jax.Array, u: jax.Array, k: jax.Array, cum: jax.Array, rel: jax.Array,
             start: jax.Array, e: jax.Array) -> jax.Array:
    """The state [H, P, N] after token e of one chunk (w, k [H, Q, N], u [H, Q, P], cum and rel [H, Q, Nd], start
    [Q]) for the segment of e, which entered the chunk with state s0 [H, P, N]."""
    mine = (start == start[e]) & (jnp.arange(start.shape[0]) <= e)  # [Q]
    decayed = k * jnp.exp(jnp.where(mine[:, None], cum[:, e][:, None] - cum, -jnp.inf))  # k_j exp(G_e - G_j)
    read = jnp.einsum("hpn,hqn->hpq", s0, w)  # S0 W_j: what the entry state predicts, taken out of u
    return (jnp.exp(rel[:, e])[:, None, :] * s0 + jnp.einsum("hqp,hqn->hpn", u, decayed)
            - jnp.einsum("hpq,hqn->hpn", read, decayed))


def _pair(a: jax.Array, b: jax.Array, decay: jax.Array) -> jax.Array:
    """sum_n a_qn b_rn decay_qrn: a, b [H, Q, N], decay [H, Q, Q, 1] (one per token, factored out of the sum) or
    [H, Q, Q, N] (one per key channel) -> [H, Q, Q]."""
    if decay.shape[-1] == 1:
        return jnp.einsum("hqn,hrn->hqr", a, b) * decay[..., 0]
    return jnp.einsum("hqn,hrn,hqrn->hqr", a, b, decay)


def _within_chunk(q: jax.Array, k: jax.Array, v: jax.Array, beta: jax.Array, cum: jax.Array, rel: jax.Array,
                  start: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """One chunk's own terms (q, k [H, Q, N], v [H, Q, P], beta [H, Q], cum and rel [H, Q, Nd], start [Q]) -> (U,
    W, y from a zero entry state, reads: y_t += S0 reads_t), the pairwise decays masked to each token's segment."""
    Q = start.shape[0]
    same = (start[:, None] == start[None, :]) & jnp.tril(jnp.ones((Q, Q), bool))
    decay = jnp.exp(jnp.where(same[None, :, :, None], cum[:, :, None] - cum[:, None], -jnp.inf))  # [H, Q, Q, Nd]
    strict = jnp.tril(jnp.ones((Q, Q), bool), -1)
    system = jnp.eye(Q) + jnp.where(strict, beta[..., None] * _pair(k, k, decay), 0.0)
    u, w = (jax.lax.linalg.triangular_solve(system, x, left_side=True, lower=True, unit_diagonal=True)
            for x in (beta[..., None] * v, beta[..., None] * jnp.exp(rel) * k))
    attn = _pair(q, k, decay)
    return u, w, attn @ u, q * jnp.exp(rel) - attn @ w


def chunked_delta(
    q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array, pool: jax.Array, slots: jax.Array,
    positions: jax.Array, seg: Segments, chunk: int,
) -> tuple[jax.Array, jax.Array]:
    """q, k [T, H, N] (normed, q scaled), v [T, H, P], log decay g [T, H] or [T, H, N], beta [T, H], the pool
    [S, H, P, N] -> (y [T, H, P], each real segment's final state [R, H, P, N]); float32. Chunked arrays are
    head-major ([chunks, H, Q, ...])."""
    T, H, N = k.shape
    nc = -(-T // chunk)
    total = nc * chunk
    g = g.reshape(T, H, -1)  # [T, H, Nd]: Nd 1 per token, N per key channel
    g, beta = (jnp.where(seg.real.reshape(-1, *(1,) * (x.ndim - 1)), x, 0.0) for x in (g, beta))  # padding: no-op
    q, k, v, g, beta = (_padded(x, total) for x in (q, k, v, g, beta))
    start = jnp.concatenate([seg.start, jnp.arange(T, total)])  # padded tokens: their own segments
    continued = _padded(seg.real, total) & (_padded(positions, total)[start] > 0)
    home = _padded(slots, total)[start]
    cum_flat = jnp.cumsum(g.reshape(nc, chunk, H, -1), axis=1).reshape(g.shape)  # within chunks, inclusive
    chunk_start = jnp.arange(total) // chunk * chunk
    entry = jnp.where((start >= chunk_start)[:, None, None], (cum_flat - g)[start], 0.0)  # G where its segment enters
    rel_flat = cum_flat - entry  # the decay since the segment entered the chunk

    def heads_first(x: jax.Array) -> jax.Array:  # [total, H, ...] -> [nc, H, Q, ...]
        return jnp.swapaxes(x.reshape(nc, chunk, *x.shape[1:]), 1, 2)

    qc, kc, vc, betac, cum, rel = (heads_first(x) for x in (q, k, v, beta, cum_flat, rel_flat))
    startc = start.reshape(nc, chunk)
    chunks = (qc, kc, vc, betac, cum, rel, startc)
    if g.shape[-1] == 1:
        u, w, y, reads = jax.vmap(_within_chunk)(*chunks)
    else:  # per-channel decays are [H, Q, Q, N] a chunk: one chunk at a time keeps them bounded
        u, w, y, reads = jax.lax.map(lambda c: _within_chunk(*c), chunks)

    def entry_state(s: jax.Array, spans: jax.Array, entering: jax.Array) -> jax.Array:
        """The state segment `s` (its first token) enters a chunk with: passed on, its slot's, or zeros."""
        return jnp.where(spans, entering, jnp.where(continued[s], 1.0, 0.0) * pool[home[s]])

    def pass_on(entering: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
        s = startc[c, -1]
        s0 = entry_state(s, s < c * chunk, entering)
        return _advance(s0, w[c], u[c], kc[c], cum[c], rel[c], startc[c], chunk - 1), entering

    _, entering = jax.lax.scan(pass_on, jnp.zeros(pool.shape[1:], jnp.float32), jnp.arange(nc))  # [nc, H, P, N]
    spanning = startc < chunk_start.reshape(nc, chunk)  # [nc, Q]: its segment entered from the previous chunk
    y = y + jnp.where(spanning[:, None, :, None], jnp.einsum("chpn,chqn->chqp", entering, reads), 0.0)

    first = seg.first  # continuing segments read their slot's state in the chunk they start in
    ch = first // chunk
    applies = seg.valid & continued[first]
    slot_state = jnp.where(applies[:, None, None, None], pool[home[first]], 0.0)  # [R, H, P, N]
    mine = (startc[ch] == first[:, None])[:, None, :, None]  # [R, 1, Q, 1]
    y = y.at[ch].add(jnp.where(mine, jnp.einsum("rhpn,rhqn->rhqp", slot_state, reads[ch]), 0.0))

    def final(last: jax.Array) -> jax.Array:
        c, s = last // chunk, start[last]
        s0 = entry_state(s, s < c * chunk, entering[c])
        return _advance(s0, w[c], u[c], kc[c], cum[c], rel[c], startc[c], last % chunk)

    return jnp.swapaxes(y, 1, 2).reshape(total, H, -1)[:T], jax.vmap(final)(seg.last)
