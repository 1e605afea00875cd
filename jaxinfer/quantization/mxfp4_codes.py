"""MXFP4 (OCP microscaling FP4) in jnp: E2M1 codes and power-of-two group scales, for experts kept in it.

Each run of 32 values along the input shares one scale 2^(s - 127) (s a uint8) and each value is a
4-bit E2M1 float: a sign bit, then one of 0, 0.5, 1, 1.5, 2, 3, 4, 6. Weights that came from an
MXFP4 checkpoint (GPT-OSS's experts) quantize back to it exactly: with the exponent chosen from
the group's largest magnitude, every stored value lands on a level again.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

GROUP = 32
SCALE_BIAS = 127
LEVELS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # E2M1 magnitudes by their 3-bit code
LARGEST = LEVELS[-1]


def decode(codes: jax.Array) -> jax.Array:
    """4-bit E2M1 codes (any integer dtype, values 0-15) as float32, built as float32 bits (no table gather):
    sign, exponent e and mantissa bit m give 2^(e-1) (1 + m/2), or m/2 where e is 0."""
    c = codes.astype(jnp.uint32)
    e, m = (c >> 1) & 3, c & 1
    normal = ((e + 126) << 23) | (m << 22)
    bits = jnp.where(e > 0, normal, m * (126 << 23)) | ((c >> 3) << 31)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def encode(scaled: jax.Array) -> jax.Array:
    """The nearest E2M1 code (uint8, 0-15) of each float32 value in [-6, 6]."""
    magnitude = jnp.abs(scaled)
    midpoints = [(a + b) / 2 for a, b in zip(LEVELS, LEVELS[1:])]
    code = sum((magnitude > m).astype(jnp.uint8) for m in midpoints)
    return code | jnp.where(jnp.signbit(scaled) & (code > 0), 8, 0).astype(jnp.uint8)


def exponents(absmax: jax.Array) -> jax.Array:
    """Each group's scale exponent (uint8, biased): the smallest that brings its largest magnitude to <= 6."""
    e = jnp.ceil(jnp.log2(jnp.maximum(absmax, 1e-38) / LARGEST))
    return (jnp.clip(e, -SCALE_BIAS, SCALE_BIAS) + SCALE_BIAS).astype(jnp.uint8)


def scale_values(exponent: jax.Array) -> jax.Array:
    """Biased uint8 exponents as their float32 powers of two."""
    return jnp.exp2(exponent.astype(jnp.float32) - SCALE_BIAS)
