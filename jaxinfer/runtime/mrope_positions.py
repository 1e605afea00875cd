"""M-RoPE's rotary positions of a request's tokens (Qwen2-VL, HF's `get_rope_index`), as offsets from their
sequence positions, made on the host for each step.

Text has its three streams (temporal, height, width) equal; an image's tokens, a blocks_h x blocks_w grid of
merged patches starting at rotary position s (the text position before it plus the delta so far), take
(s, s + row, s + col); the text after it continues from s + max(blocks_h, blocks_w), so each image moves the
later positions by max(blocks_h, blocks_w) - blocks_h * blocks_w (HF's `rope_deltas`, vLLM's
`mrope_position_delta`). A Qwen2-VL / Qwen2.5-VL video's tokens are its frame groups' grids one after another, group
k's temporal stream at s + temporal[k] (k for Qwen2-VL, k scaled by the frame rate for Qwen2.5-VL); the text after it
continues from s + max(blocks_h, blocks_w) as after an image (transformers 5's rule). A token's offset is its rotary
position minus its sequence position: zeros for a text-only request, and every generated token's is its request's
whole delta (the last prompt token's position + 1, as HF's generate continues; its get_rope_index's `rope_deltas`,
the largest position + 1, is larger only where a video's last temporal position lies past the text after it). The
cache is written at sequence positions; only the rotation reads the offsets.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxinfer.runtime.host_step import HostStep
from jaxinfer.runtime.image_input import ImageInput


def image_grid(image: ImageInput) -> tuple[int, int]:
    """(blocks_h, blocks_w): the merged grid of a Qwen2-VL image (its pixels [blocks_h, blocks_w, m*m, F]) or of each
    frame group of a video (its pixels [groups, blocks_h, blocks_w, m*m, F])."""
    shape = image.pixels.shape[1:] if image.temporal else image.pixels.shape
    return int(shape[0]), int(shape[1])


def image_delta(image: ImageInput) -> int:
    """How far an image (or video) moves the rotary positions of the text after it."""
    return max(image_grid(image)) - image.length


def vision_streams(image: ImageInput, k: np.ndarray, start: int) -> np.ndarray:
    """[len(k), 3] rotary positions of an image's (video's) k-th tokens, its first at rotary position start."""
    blocks_h, blocks_w = image_grid(image)
    frame, cell = np.divmod(k, blocks_h * blocks_w)
    temporal = np.asarray(image.temporal or (0,), np.int64)[frame]
    return np.stack([start + temporal, start + cell // blocks_w, start + cell % blocks_w], axis=-1)


def offsets(images: tuple[ImageInput, ...], positions: np.ndarray) -> np.ndarray:
    """[len(positions), 3] int32: each sequence position's (temporal, height, width) rotary offsets."""
    out = np.zeros((len(positions), 3), np.int64)
    delta = 0
    for image in sorted((i for i in images if i.pixels is not None), key=lambda i: i.offset):
        end = image.offset + image.length
        inside = (positions >= image.offset) & (positions < end)
        out[inside] = vision_streams(image, positions[inside] - image.offset, image.offset + delta) \
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
