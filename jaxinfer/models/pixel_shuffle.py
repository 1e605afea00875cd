"""Pixel shuffle (space to depth) over a vision tower's square patch grid: each scale x scale block of patches
becomes one row, as Idefics3 / SmolVLM and InternVL shrink a tile's patches before projecting them (both HF
implementations reshape and transpose in this same order)."""

from __future__ import annotations

import jax


def pixel_shuffle(x: jax.Array, scale: int) -> jax.Array:
    """States [N, S, E] of a square patch grid -> [N, S / scale^2, E * scale^2] (each row's `scale` neighbouring
    patches joined, then `scale` such rows of the same columns)."""
    n, seq, e = x.shape
    side = int(round(seq ** 0.5))
    x = x.reshape(n, side, side // scale, e * scale).transpose(0, 2, 1, 3)
    x = x.reshape(n, side // scale, side // scale, e * scale * scale).transpose(0, 2, 1, 3)
    return x.reshape(n, seq // scale ** 2, e * scale * scale)
