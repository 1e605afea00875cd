"""Structured-output masks on the device: a packed bitmask the host fills, applied to the logits.

The layout is the one llguidance and xgrammar fill: int32 words [R, ceil(V / 32)], bit j of word i
set when token 32 * i + j may come next. An unconstrained row is all ones (-1 words) and changes
nothing, so every step program takes the mask and constrained and free rows share the programs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

BITS = 32


def bitmask_width(vocab_size: int) -> int:
    """Words per row of a packed mask over vocab_size tokens."""
    return -(-vocab_size // BITS)


def all_allowed(rows: int, vocab_size: int) -> np.ndarray:
    """A host mask [rows, bitmask_width(vocab_size)] that allows every token."""
    return np.full((rows, bitmask_width(vocab_size)), -1, np.int32)


def unpack_bitmask(bitmask: jax.Array, vocab_size: int) -> jax.Array:
    """Allowed tokens [R, vocab_size] bool of a packed mask [R, W]."""
    shifts = jnp.arange(BITS, dtype=jnp.int32)
    bits = (bitmask[:, :, None] >> shifts) & 1  # arithmetic shift: the sign bit's copies are masked off
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].astype(bool)


def apply_token_bitmask(logits: jax.Array, bitmask: jax.Array) -> jax.Array:
    """Logits [R, V] with the tokens each row's packed mask [R, ceil(V / 32)] forbids at -inf."""
    allowed = unpack_bitmask(bitmask, logits.shape[-1])
    return jnp.where(allowed, logits, jnp.asarray(-jnp.inf, logits.dtype))
