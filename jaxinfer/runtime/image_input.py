"""A prompt's images as the engine carries them (plain data, no jax: the host's request holds them), and
prompt embeddings (vLLM's `prompt_embeds`), carried the same way: rows given instead of made by a tower.

Each image has a run of placeholder tokens in the prompt (`offset`, `length`); the vision tower
turns its pixels into `length` rows that replace those tokens' embeddings. The rows are computed
once, when the request is first scheduled (runtime/vision_runner), and stay with the request
(`Request.image_rows`), so chunked prefill and recompute after preemption read them again
without running the tower. `content_hash` names the pixels: prefix caching keys the pages holding
placeholders by it (`cache_keys`), so the same prompt text with another image shares no such page.
A prompt_embeds prompt is one such input over all its positions, its `rows` the embeddings themselves
(entrypoints/prompt_embeds): the same override, chunk slicing, preemption and prefix keys, no tower.
A LLaVA-NeXT or OneVision image's pixels are all its tiles, and its `RowLayout` says which of their rows (or which
weighted sum of them, or the model's newline row) each placeholder takes (models/llava_next). A Qwen2-VL or Qwen2.5-VL
video is one input too: its frame groups' patches one after another, and each group's temporal rotary step
(`temporal`: runtime/mrope_positions).
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np


@dataclasses.dataclass(frozen=True)
class RowLayout:
    """Each placeholder's row as a weighted sum of source rows: an image's tiles' rows end to end, then the model's
    newline row (LLaVA-NeXT's, OneVision's)."""

    index: np.ndarray  # [length, K] int64 source rows
    weight: np.ndarray  # [length, K] float32

    def rows(self, source: np.ndarray) -> np.ndarray:
        """[length, D] float32 rows of the source rows [S, D] (one tap at a time: no [length, K, D] temporary)."""
        out = self.weight[:, :1] * source[self.index[:, 0]]
        for k in range(1, self.index.shape[1]):
            out += self.weight[:, k : k + 1] * source[self.index[:, k]]
        return out


@dataclasses.dataclass(frozen=True)
class ImageInput:
    """One image of a prompt: its placeholder positions and preprocessed pixels (or given rows)."""

    offset: int  # first placeholder position in the prompt
    length: int  # placeholder tokens (the rows its features fill)
    content_hash: str
    pixels: np.ndarray | None = dataclasses.field(repr=False)  # [C, H, W] float32 as the image processor made it
    # [length, D] float32 rows given as they are (prompt embeddings): no tower runs, and they see causally only
    rows: np.ndarray | None = dataclasses.field(default=None, repr=False)
    layout: RowLayout | None = dataclasses.field(default=None, repr=False)  # pixels [T, C, H, W]: tiles laid out
    # A Qwen2-VL video's (pixels [groups, blocks_h, blocks_w, m*m, F]): each frame group's temporal rotary position
    # past the video's start; empty for an image
    temporal: tuple[int, ...] = ()

    @staticmethod
    def of(offset: int, length: int, pixels: np.ndarray, layout: RowLayout | None = None,
           temporal: tuple[int, ...] = ()) -> "ImageInput":
        """An image whose hash is that of its pixels (and their shape), and of its layout where it has one (the same
        tiles cropped for another image size are other rows); a video's, of its frames' temporal positions too (the
        same frames at another frame rate turn the text after them otherwise)."""
        pixels = np.ascontiguousarray(pixels, np.float32)
        digest = hashlib.blake2b(str(pixels.shape).encode(), digest_size=16)
        digest.update(pixels.tobytes())
        if layout is not None:
            digest.update(np.ascontiguousarray(layout.index).tobytes() + np.ascontiguousarray(layout.weight).tobytes())
        if temporal:
            digest.update(str(temporal).encode())
        return ImageInput(offset, length, digest.hexdigest(), pixels, layout=layout, temporal=tuple(temporal))

    @staticmethod
    def given(rows: np.ndarray) -> "ImageInput":
        """Rows [L, D] standing for a whole L-token prompt (prompt_embeds), hashed by their content."""
        rows = np.ascontiguousarray(rows, np.float32)
        digest = hashlib.blake2b(str(rows.shape).encode(), digest_size=16)
        digest.update(rows.tobytes())
        return ImageInput(0, len(rows), "embeds-" + digest.hexdigest(), None, rows)


def cache_keys(ids: list[int], images: tuple[ImageInput, ...]) -> list[int | str]:
    """What prefix caching hashes per position: the token id, or at an image's placeholders its content hash
    (vLLM's mm_hash in the block hash)."""
    if not images:
        return ids
    keys: list[int | str] = list(ids)
    for image in images:
        keys[image.offset : image.offset + image.length] = [f"image:{image.content_hash}"] * image.length
    return keys


def whole_prompt_keys(keys: list[int | str], prompt_length: int) -> list[int | str]:
    """keys with the first naming the whole prompt (its keys' digest): where every prompt token sees the whole
    prompt (PaliGemma's prefix), a page's K/V depend on the prompt's later tokens too, and page hashes chain, so
    only the same prompt (and images) then shares any page."""
    digest = hashlib.blake2b(repr(keys[:prompt_length]).encode(), digest_size=16).hexdigest()
    return [f"prompt:{digest}", *keys[1:]]


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
