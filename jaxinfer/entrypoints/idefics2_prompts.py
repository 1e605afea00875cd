"""Idefics2's image prompts: the processor (Idefics2ImageProcessor) makes each image one tile, or with
`do_image_splitting` its four quarters and then itself, each resized within its size bounds (so tiles differ in
size: models/idefics2_vision pads them to the tower's). HF's Idefics2Processor writes each `<image>` of the text as
`<fake_token_around_image>`, `image_seq_len` `<image>`s and `<fake_token_around_image>` per tile, merges the doubled
marks between tiles and adjacent images, and puts a space after a closing mark that a word follows; a text prompt
gets that same text, token ids get each image's tile runs spliced in (HF's already-expanded ids run as they are).
Each tile is one `ImageInput` over its own `<image>` run (the marks between runs are text).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

from jaxinfer.engine.prompt_checks import encode_prompt
from jaxinfer.entrypoints.idefics3_prompts import tile_runs
from jaxinfer.models.idefics2_vision import Idefics2Config, with_mask
from jaxinfer.runtime.image_input import ImageInput

FAKE, IMAGE = "<fake_token_around_image>", "<image>"
CLOSING_MARK = re.compile(rf"{re.escape(FAKE)}(?=[^\s<])")  # a mark a word follows: HF puts a space between


def image_tiles(processor: Any, image: Any, cfg: Idefics2Config, field: str) -> list[np.ndarray]:
    """One image's tiles, each [C + 1, S, S]: its pixels padded to the tower's size and its pixel mask
    (`with_mask`); ValueError when the processor makes a tile larger than the tower's image_size."""
    made = processor(image, return_tensors="np")
    pixels = np.asarray(made["pixel_values"], np.float32)[0]
    masks = np.asarray(made["pixel_attention_mask"])[0] if "pixel_attention_mask" in made else \
        np.ones(pixels.shape[:1] + pixels.shape[2:], np.int64)
    side, v = cfg.vision.image_size, cfg.vision
    if pixels.shape[1] != v.num_channels or max(pixels.shape[2:]) > side:
        raise ValueError(f"{field}: the image processor made tiles of {pixels.shape[1:]} pixels; the tower takes "
                         f"{v.num_channels} channels and at most {side} x {side} (size's longest_edge must be at "
                         "most vision_config.image_size)")
    return [with_mask(tile, mask, side) for tile, mask in zip(pixels, masks)]


def expanded_text(text: str, tiles_per_image: int, seq_len: int) -> str:
    """HF's Idefics2Processor text of a prompt whose `<image>`s each stand for `tiles_per_image` tiles."""
    text = text.replace(IMAGE, f"{FAKE}{IMAGE * seq_len}{FAKE}" * tiles_per_image)
    return CLOSING_MARK.sub(f"{FAKE} ", text.replace(FAKE + FAKE, FAKE))


def idefics2_prompt(prompt: str | Sequence[int], images: list[Any], cfg: Idefics2Config, tokenizer: Any,
                    processor: Any, field: str) -> tuple[list[int], tuple[ImageInput, ...]]:
    """(ids with each image's `<image>` expanded to its tiles' runs, one ImageInput per tile)."""
    tiles = [tile for image in images for tile in image_tiles(processor, image, cfg, field)]
    per_image, seq_len, token = len(tiles) // len(images), cfg.image_seq_len, cfg.image_token_id
    ids = encode_prompt(prompt, tokenizer)
    marks = [i for i, t in enumerate(ids) if t == token]
    if len(marks) == len(images) and isinstance(prompt, str):
        ids = encode_prompt(expanded_text(prompt, per_image, seq_len), tokenizer)
    elif len(marks) == len(images):
        run = tokenizer.encode(expanded_text(IMAGE, per_image, seq_len), add_special_tokens=False)
        ids = [piece for t in ids for piece in (run if t == token else [t])]
    starts = tile_runs(ids, token, seq_len)
    if starts is None or len(starts) != len(tiles):
        raise ValueError(f"{field}: the prompt marks {len(marks)} image(s) with {IMAGE!r} and {len(images)} were "
                         f"given; put one {IMAGE!r} where each image goes")
    return ids, tuple(ImageInput.of(s, seq_len, tile) for s, tile in zip(starts, tiles))
