"""M-RoPE's rotary positions of a request's tokens (Qwen2-VL, HF's `get_rope_index`), as offsets from their
sequence positions, made on the host for each step.

Text has its three streams (temporal, height, width) equal; an image's tokens, a blocks_h x blocks_w grid of
merged patches starting at rotary position s (the text position before it plus the delta so far), take
(s, s + row, s + col); the text after it continues from s + max(blocks_h, blocks_w), so each image moves the
later positions by max(blocks_h, blocks_w) - blocks_h * blocks_w (HF's `rope_deltas`, vLLM's
`mrope_position_delta`). A token's offset is its rotary position minus its sequence position: zeros for a
text-only request, and every decode token's is its request's whole delta. The cache is written at sequence
positions; only the rotation reads the offsets.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxinfer.runtime.host_step import HostStep
from jaxinfer.runtime.image_input import ImageInput


def image_grid(image: ImageInput) -> tuple[int, int]:
    """(blocks_h, blocks_w): the merged grid of a Qwen2-VL image (its pixels [blocks_h, blocks_w, m*m, F])."""
    return int(image.pixels.shape[0]), int(image.pixels.shape[1])


def image_delta(image: ImageInput) -> int:
    """How far an image moves the rotary positions of the text after it."""
    blocks_h, blocks_w = image_grid(image)
    return max(blocks_h, blocks_w) - blocks_h * blocks_w


def offsets(images: tuple[ImageInput, ...], positions: np.ndarray) -> np.ndarray:
    """[len(positions), 3] int32: each sequence position's (temporal, height, width) rotary offsets."""
    out = np.zeros((len(positions), 3), np.int64)
    delta = 0
    for image in sorted((i for i in images if i.pixels is not None), key=lambda i: i.offset):
        end = image.offset + image.length
        inside = (positions >= image.offset) & (positions < end)
        k = positions[inside] - image.offset
        start, width = image.offset + delta, image_grid(image)[1]
        out[inside] = np.stack([np.full_like(k, start), start + k // width, start + k % width], axis=-1) \
            - positions[inside][:, None]
        delta += image_delta(image)
        out[positions >= end] = delta
    return out.astype(np.int32)


def total_delta(images: tuple[ImageInput, ...]) -> int:
    """The offset of every token after all of a request's images (its decode tokens')."""
    return sum(image_delta(i) for i in images if i.pixels is not None)


def step_offsets(host: HostStep) -> np.ndarray:
    """[T, 3] int32 rotary offsets of a step's flat tokens (a decode row's: its request's whole delta, whatever
    the placeholder position a row carried from the call ahead holds)."""
    out = np.zeros((len(host.tokens), 3), np.int32)
    for r, request in enumerate(host.requests):
        images: Any = getattr(request, "images", None)
        if not images:
            continue
        mine = np.flatnonzero((host.token_rows == r) & (host.positions >= 0))
        if host.decode or host.drafts is not None:
            out[mine] = total_delta(images)
        else:
            out[mine] = offsets(images, host.positions[mine])
    return out
