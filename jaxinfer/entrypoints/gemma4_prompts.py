"""Gemma 4's image prompts: the processor (Gemma4ImageProcessor) resizes each image, keeping its aspect, to at most
max_soft_tokens x k² patches with sides multiples of k patches, so each image has its own number of rows (one per
k x k patches); the prompt's one image token per image becomes HF's Gemma4Processor sequence: <boi>, that many
image tokens, <eoi>. The image tokens are the image's placeholders; <boi> and <eoi> are text. Token ids already
expanded (HF's processor's) run as they are.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxinfer.engine.prompt_checks import encode_prompt
from jaxinfer.models.gemma4_vision import Gemma4VisionConfig
from jaxinfer.runtime.image_input import ImageInput


def image_pixels(processor: Any, image: Any, cfg: Gemma4VisionConfig, field: str) -> np.ndarray:
    """One image's pixels [C, H, W] at its processed size, rebuilt from the processor's patches and positions;
    ValueError when they do not fit the tower."""
    made = processor(image, return_tensors="np")
    patches, where = np.asarray(made["pixel_values"], np.float32)[0], np.asarray(made["image_position_ids"])[0]
    live = (where >= 0).all(axis=-1)
    v, count = cfg.vision, int(live.sum())
    cols = int(where[live, 0].max()) + 1
    rows = count // cols
    if patches.shape[-1] != v.patch_dims or rows * cols != count or rows % v.pool or cols % v.pool:
        raise ValueError(f"{field}: the image processor made {count} patches of {patches.shape[-1]} values; the tower "
                         f"takes {v.patch_dims} a patch, a grid whose sides are multiples of {v.pool}")
    grid = patches[live].reshape(rows, cols, v.patch_size, v.patch_size, v.num_channels)
    return grid.transpose(4, 0, 2, 1, 3).reshape(v.num_channels, rows * v.patch_size, cols * v.patch_size)


def soft_tokens(pixels: np.ndarray, cfg: Gemma4VisionConfig) -> int:
    """The rows (image tokens) of an image at its processed size: one per k x k patches."""
    side = cfg.vision.patch_size * cfg.vision.pool
    return (pixels.shape[1] // side) * (pixels.shape[2] // side)


def gemma4_prompt(prompt: str | Sequence[int], images: list[Any], cfg: Gemma4VisionConfig, tokenizer: Any,
                  processor: Any, field: str) -> tuple[list[int], tuple[ImageInput, ...]]:
    """(ids with each image token expanded to <boi>, its rows' image tokens, <eoi>; the images as the engine carries
    them)."""
    ids = encode_prompt(prompt, tokenizer)
    pixels = [image_pixels(processor, image, cfg, field) for image in images]
    counts = [soft_tokens(p, cfg) for p in pixels]
    marks = [i for i, t in enumerate(ids) if t == cfg.image_token_id]
    if len(marks) == len(images) and not (all(n == 1 for n in counts) and _runs(ids, counts, cfg) is not None):
        out, carried, previous = [], [], 0
        for mark, count, p in zip(marks, counts, pixels):
            out += ids[previous:mark] + [cfg.boi_token_id]
            carried.append(ImageInput.of(len(out), count, p))
            out += [cfg.image_token_id] * count + [cfg.eoi_token_id]
            previous = mark + 1
        return out + ids[previous:], tuple(carried)
    starts = _runs(ids, counts, cfg)
    if starts is None:
        mark = tokenizer.convert_ids_to_tokens(cfg.image_token_id)
        raise ValueError(f"{field}: the prompt marks {len(marks)} image(s) with {mark!r} and {len(images)} were "
                         f"given; put one {mark!r} where each image goes")
    return ids, tuple(ImageInput.of(s, n, p) for s, n, p in zip(starts, counts, pixels))


def _runs(ids: list[int], counts: list[int], cfg: Gemma4VisionConfig) -> list[int] | None:
    """Where each image's expanded run of image tokens starts (between <boi> and <eoi>), or None."""
    starts, at = [], 0
    for count in counts:
        run = [cfg.boi_token_id] + [cfg.image_token_id] * count + [cfg.eoi_token_id]
        first = next((i for i in range(at, len(ids) - len(run) + 1) if ids[i : i + len(run)] == run), None)
        if first is None:
            return None
        starts.append(first + 1)
        at = first + len(run)
    return starts
