"""Mistral 3's image prompts: the processor (PixtralImageProcessor) resizes each image, its longest edge within
`size.longest_edge`, to multiples of patch * merge pixels, so each image has its own merged grid of R x C blocks;
the prompt's one [IMG] per image becomes HF's PixtralProcessor run: per merged row C [IMG] and an [IMG_BREAK],
the last row's break an [IMG_END]. The whole run is the image's placeholders (models/pixtral_vision gives the
break and end positions their own embeddings). Token ids already expanded (HF's processor's) run as they are.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxinfer.engine.prompt_checks import encode_prompt
from jaxinfer.models.pixtral_vision import Mistral3Config
from jaxinfer.runtime.image_input import ImageInput


def image_pixels(processor: Any, images: list[Any], cfg: Mistral3Config, field: str) -> list[np.ndarray]:
    """Each image's pixels [C, H, W] at its processed size (H, W multiples of patch * merge); ValueError when the
    processor makes another shape."""
    side = cfg.block_pixels
    out = []
    for image in images:  # one at a time: a batch is padded to its largest image
        made = processor(image, patch_size={"height": side, "width": side}, return_tensors="np")
        (height, width), pixels = np.asarray(made["image_sizes"])[0], np.asarray(made["pixel_values"], np.float32)[0]
        if pixels.shape[0] != cfg.vision.channels or height % side or width % side:
            raise ValueError(f"{field}: the image processor made {pixels.shape[0]} channels of {height} x {width} "
                             f"pixels; the tower takes {cfg.vision.channels} channels in multiples of {side} pixels")
        out.append(pixels[:, :height, :width])
    return out


def image_run(pixels: np.ndarray, cfg: Mistral3Config) -> list[int]:
    """The placeholder ids of one image: per merged row its [IMG]s and [IMG_BREAK], the last break [IMG_END]."""
    rows, cols = pixels.shape[1] // cfg.block_pixels, pixels.shape[2] // cfg.block_pixels
    run = ([cfg.image_token_id] * cols + [cfg.image_break_token_id]) * rows
    run[-1] = cfg.image_end_token_id
    return run


def expanded_runs(ids: list[int], runs: list[list[int]]) -> list[int] | None:
    """Where each image's whole run starts in ids already expanded (in order, one [IMG] run each), or None."""
    starts, at = [], 0
    for run in runs:
        first = next((i for i in range(at, len(ids) - len(run) + 1) if ids[i : i + len(run)] == run), None)
        if first is None:
            return None
        starts.append(first)
        at = first + len(run)
    return starts


def mistral3_prompt(prompt: str | Sequence[int], images: list[Any], cfg: Mistral3Config, tokenizer: Any,
                    processor: Any, field: str) -> tuple[list[int], tuple[ImageInput, ...]]:
    """(ids with each image's [IMG] expanded to its run, the images as the engine carries them)."""
    ids = encode_prompt(prompt, tokenizer)
    pixels = image_pixels(processor, images, cfg, field)
    runs = [image_run(p, cfg) for p in pixels]
    marks = [i for i, t in enumerate(ids) if t == cfg.image_token_id]
    whole = len(marks) == len(images) and all(ids[m : m + len(r)] == r for m, r in zip(marks, runs))  # 1 x 1 runs
    if len(marks) != len(images) or whole:
        starts = expanded_runs(ids, runs) if len(marks) == sum(r.count(cfg.image_token_id) for r in runs) else None
        if starts is None:
            mark = tokenizer.convert_ids_to_tokens(cfg.image_token_id)
            raise ValueError(f"{field}: the prompt marks {len(marks)} image(s) with {mark!r} and {len(images)} were "
                             f"given; put one {mark!r} where each image goes")
        return ids, tuple(ImageInput.of(s, len(r), p) for s, r, p in zip(starts, runs, pixels))
    out, carried, previous = [], [], 0
    for mark, run, p in zip(marks, runs, pixels):
        out += ids[previous:mark]
        carried.append(ImageInput.of(len(out), len(run), p))
        out += run
        previous = mark + 1
    return out + ids[previous:], tuple(carried)
