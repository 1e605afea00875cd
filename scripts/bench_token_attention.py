"""One SmolLM-shaped attention layer of a 512-token prefill chunk on CPU: the engine's per-token
rows through the native paged decode kernel (as [T, 1] rows and as [T/16, 16] blocks of one
sequence) against the blocked XLA row attention prefill chunks used before, from position 0 and
over a 1024-token cached prefix. Prints milliseconds (median of 7) and the largest difference.

    python scripts/bench_token_attention.py
"""
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.kernels.cpu.decode_attention import paged_decode_attention
from jaxinfer.models.blocked_attention import blocked_rows_attention

KV, H, D, PAGE = 3, 9, 64, 16
W = 128  # pages per seq (2048 tokens)
P = 600
T = 512
rng = np.random.default_rng(0)
kp = jnp.asarray(rng.integers(0, 2**15, (KV, P, PAGE, D)).astype(np.uint16) & 0x3fff)
vp = jnp.asarray(rng.integers(0, 2**15, (KV, P, PAGE, D)).astype(np.uint16) & 0x3fff)
table = np.zeros((1, W), np.int32); table[0, :] = np.arange(1, W + 1)
q = jnp.asarray(rng.standard_normal((T, H, D)), jnp.bfloat16)
for start in (0, 1024):
    positions = start + np.arange(T, dtype=np.int32)
    f_tok = jax.jit(lambda q, kp, vp, t, p: paged_decode_attention(q[:, None], kp, vp, t, p[:, None], 0, jnp.bfloat16)[:, 0])
    tok_table = jnp.asarray(np.repeat(table, T, 0))
    f_blk = jax.jit(lambda q, kp, vp, t, p: paged_decode_attention(q.reshape(T // 16, 16, H, D), kp, vp, t, p.reshape(-1, 16), 0, jnp.bfloat16).reshape(T, H, D))
    blk_table = jnp.asarray(np.repeat(table, T // 16, 0))
    cache = PagedKVCache([kp], [vp], None, None, jnp.asarray(table), bits_of="bfloat16")
    f_ref = jax.jit(lambda q, c, t: blocked_rows_attention(q[None], c, 0, 0, jnp.array([start + T]), t, jnp.array([T]), jnp.bfloat16)[0])
    def tm(f, *a):
        f(*a).block_until_ready(); ts = []
        for _ in range(7):
            t0 = time.perf_counter(); f(*a).block_until_ready(); ts.append(time.perf_counter() - t0)
        return np.median(ts) * 1e3
    pos = jnp.asarray(positions)
    a = f_tok(q, kp, vp, tok_table, pos); b = f_blk(q, kp, vp, blk_table, pos); c = f_ref(q, cache, jnp.asarray(table))
    print(start, "maxdiff tok-blk", float(jnp.max(jnp.abs(a.astype(float) - b.astype(float)))), "tok-ref", float(jnp.max(jnp.abs(a.astype(float) - c.astype(float)))))
    print(start, "per-token %.2f ms, 16-query blocks %.2f ms, blocked jnp %.2f ms" % (tm(f_tok, q, kp, vp, tok_table, pos), tm(f_blk, q, kp, vp, blk_table, pos), tm(f_ref, q, cache, jnp.asarray(table))))
