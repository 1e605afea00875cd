"""A prompt's images as the engine carries them (plain data, no jax: the host's request holds them).

Each image has a run of placeholder tokens in the prompt (`offset`, `length`); the vision tower
turns its pixels into `length` rows that replace those tokens' embeddings. The rows are computed
once, when the request is first scheduled (runtime/vision_runner), and stay with the request
(`Request.image_rows`), so chunked prefill and recompute after preemption read them again
without running the tower. `content_hash` names the pixels: prefix caching keys the pages holding
placeholders by it (`cache_keys`), so the same prompt text with another image shares no such page.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np


@dataclasses.dataclass(frozen=True)
class ImageInput:
    """One image of a prompt: its placeholder positions and preprocessed pixels."""

    offset: int  # first placeholder position in the prompt
    length: int  # placeholder tokens (the rows its features fill)
    content_hash: str
    pixels: np.ndarray = dataclasses.field(repr=False)  # [C, H, W] float32 as the model's image processor made it

    @staticmethod
    def of(offset: int, length: int, pixels: np.ndarray) -> "ImageInput":
        """An image whose hash is that of its pixels (and their shape)."""
        pixels = np.ascontiguousarray(pixels, np.float32)
        digest = hashlib.blake2b(str(pixels.shape).encode(), digest_size=16)
        digest.update(pixels.tobytes())
        return ImageInput(offset, length, digest.hexdigest(), pixels)


def cache_keys(ids: list[int], images: tuple[ImageInput, ...]) -> list[int | str]:
    """What prefix caching hashes per position: the token id, or at an image's placeholders its content hash
    (vLLM's mm_hash in the block hash)."""
    if not images:
        return ids
    keys: list[int | str] = list(ids)
    for image in images:
        keys[image.offset : image.offset + image.length] = [f"image:{image.content_hash}"] * image.length
    return keys


def image_token_rows(images: tuple[ImageInput, ...], start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(chunk offsets, rows) of the placeholder positions in [start, start + count): each one's index within
    the chunk and within the request's concatenated image rows (an image cut by a chunk gives its part)."""
    offsets, rows, first_row = [], [], 0
    for image in images:
        lo, hi = max(start, image.offset), min(start + count, image.offset + image.length)
        if lo < hi:
            offsets.append(np.arange(lo - start, hi - start))
            rows.append(np.arange(first_row + lo - image.offset, first_row + hi - image.offset))
        first_row += image.length
    if not offsets:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(offsets), np.concatenate(rows)
