"""Qwen4-Exp's hashed n-gram ids (transformers' `Qwen4ExpTextNGramEmbedding`) in 32-bit integer arithmetic.

A token's n-gram of order n hashes the token and the n - 1 before it: each times its position's odd 64-bit
multiplier (wrapping modulo 2**64, as torch's int64 product does), XORed together, read as a signed int64 and
taken modulo each head's prime (Python's sign: the remainder is never negative). jax runs without 64-bit
integers, so a 64-bit value here is a (high, low) pair of uint32 words, products are built from 16-bit halves
and the remainder from a few bits at a time (Horner's rule, each step below 2**32 for the prime at hand).

Before the first token, and across an end-of-sequence token, an n-gram reads the EOS id instead of the token
(transformers' `_shift_right_ignore_eos`: a sequence's n-grams never reach into the one before it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.config.qwen4_exp import NgramTable

Word64 = tuple[jax.Array, jax.Array]  # (high, low) uint32 words of a 64-bit value


def _wide_product(a: jax.Array, b: int) -> Word64:
    """a [...] uint32 times the 32-bit constant b as a 64-bit (high, low) pair."""
    a0, a1 = a & 0xFFFF, a >> 16
    b0, b1 = jnp.uint32(b & 0xFFFF), jnp.uint32(b >> 16)
    low, cross0, cross1, high = a0 * b0, a1 * b0, a0 * b1, a1 * b1
    middle = (low >> 16) + (cross0 & 0xFFFF) + (cross1 & 0xFFFF)  # below 3 * 2**16: no wrap
    low = (low & 0xFFFF) | (middle << 16)
    return high + (cross0 >> 16) + (cross1 >> 16) + (middle >> 16), low


def times_multiplier(tokens: jax.Array, multiplier: int) -> Word64:
    """tokens [...] (non-negative int32) times a 64-bit constant, modulo 2**64."""
    t = tokens.astype(jnp.uint32)
    high, low = _wide_product(t, multiplier & 0xFFFFFFFF)
    return high + t * jnp.uint32(multiplier >> 32 & 0xFFFFFFFF), low


def signed_remainder(value: Word64, prime: int) -> jax.Array:
    """value read as a signed int64, modulo `prime` (< 2**31), in [0, prime): int32."""
    high, low = value
    step = 32 - (prime - 1).bit_length()  # bits taken per step: remainder * 2**step + bits stays below 2**32
    remainder = jnp.zeros_like(low)
    for end in range(64, 0, -step):
        start = max(end - step, 0)
        remainder = (remainder << (end - start)) + _bits(high, low, start, end - start)
        remainder = remainder % jnp.uint32(prime)
    negative = (high >> 31) == 1  # the int64 is value - 2**64
    shift = jnp.uint32((1 << 64) % prime)
    remainder = jnp.where(negative, (remainder + jnp.uint32(prime) - shift) % jnp.uint32(prime), remainder)
    return remainder.astype(jnp.int32)


def _bits(high: jax.Array, low: jax.Array, start: int, width: int) -> jax.Array:
    """Bits [start, start + width) of the 64-bit (high, low) value (width < 32), as uint32."""
    mask = jnp.uint32((1 << width) - 1)
    if start >= 32:
        return (high >> (start - 32)) & mask
    if start + width <= 32:
        return (low >> start) & mask
    return ((low >> start) | (high << (32 - start))) & mask


def segment_context(earlier: list[jax.Array], eos: int) -> list[jax.Array]:
    """earlier[i]: the token i places back (earlier[0] the token itself; eos before the sequence) -> each as its
    n-gram reads it: eos once an EOS lies between it and the token (transformers' `_shift_right_ignore_eos`: an
    n-gram never reaches into the sequence before an EOS)."""
    context, crossed = [earlier[0]], jnp.zeros(earlier[0].shape, bool)
    for back in earlier[1:]:
        crossed = crossed | (back == eos)
        context.append(jnp.where(crossed, eos, back))
    return context


def sequence_context(tokens: jax.Array, order: int, eos: int) -> list[jax.Array]:
    """The n-gram context of tokens [B, T] (each row one sequence from its first token): `segment_context` of the
    tokens 0..order - 1 places back."""
    earlier = [jnp.pad(tokens[:, :tokens.shape[1] - i], ((0, 0), (i, 0)), constant_values=eos) for i in range(order)]
    return segment_context(earlier, eos)


def ngram_rows(context: list[jax.Array], table: NgramTable, heads_per_ngram: int) -> jax.Array:
    """Each token's row of its layer's n-gram table per head [..., heads] from its context (`segment_context`):
    orders 2..n, heads_per_ngram each."""
    order = len(table.multipliers)
    products = [times_multiplier(context[i], table.multipliers[i]) for i in range(order)]
    rows, high, low = [], *products[0]
    for n in range(2, order + 1):
        high, low = high ^ products[n - 1][0], low ^ products[n - 1][1]
        for h in range((n - 2) * heads_per_ngram, (n - 1) * heads_per_ngram):
            rows.append(signed_remainder((high, low), table.head_rows[h]) + table.head_offsets[h])
    return jnp.stack(rows, axis=-1)
