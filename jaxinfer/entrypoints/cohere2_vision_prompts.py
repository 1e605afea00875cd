"""Cohere2 Vision's image prompts: each image's tiles (entrypoints/cohere2_vision_tiles), and each image token of the
prompt (`<|IMG_PATCH|>`, the processor's `image_token`) expanded to HF's Cohere2VisionProcessor text:
`<|START_OF_IMG|>`, per tile `image_seq_len` `<|IMG_PATCH|>`s and `<|IMG_LINE_BREAK|>`, `<|END_OF_IMG|>` (all special
tokens, so ids are spliced). Each tile is its own `ImageInput` over its own run. Token ids already expanded (HF's
processor's) run as they are.
"""

from __future__ import annotations

from typing import Any, Sequence

from jaxinfer.engine.prompt_checks import encode_prompt
from jaxinfer.entrypoints.idefics3_prompts import tile_runs
from jaxinfer.entrypoints.internvl_prompts import image_tiles, token_id
from jaxinfer.models.cohere2_vision import Cohere2VisionConfig
from jaxinfer.runtime.image_input import ImageInput

START, END, BREAK = "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_LINE_BREAK|>"


def image_ids(tiles: int, patch: int, seq_len: int, tokenizer: Any, field: str) -> list[int]:
    """HF's expansion of one image of `tiles` tiles, as ids; ValueError when the tokenizer lacks a mark."""
    marks = [token_id(tokenizer, mark) for mark in (START, END, BREAK)]
    if None in marks:
        raise ValueError(f"{field}: the tokenizer has no {START!r} / {END!r} / {BREAK!r} tokens to lay an image out")
    start, end, line_break = marks
    return [start] + ([patch] * seq_len + [line_break]) * tiles + [end]


def cohere2_vision_prompt(prompt: str | Sequence[int], images: list[Any], cfg: Cohere2VisionConfig, tokenizer: Any,
                          processor: Any, field: str) -> tuple[list[int], tuple[ImageInput, ...]]:
    """(ids with each image token expanded to its tiles' layout, one ImageInput per tile)."""
    made = [image_tiles(processor, image, cfg.vision, field) for image in images]
    tiles = [tile for pixels in made for tile in pixels]
    ids, patch, seq_len = encode_prompt(prompt, tokenizer), cfg.image_token_id, cfg.image_seq_len
    marks = [i for i, t in enumerate(ids) if t == patch]
    if len(marks) == len(images):
        out, previous = [], 0
        for at, pixels in zip(marks, made):
            out += ids[previous:at] + image_ids(len(pixels), patch, seq_len, tokenizer, field)
            previous = at + 1
        ids = out + ids[previous:]
    starts = tile_runs(ids, patch, seq_len)
    if starts is None or len(starts) != len(tiles):
        mark = tokenizer.convert_ids_to_tokens(patch)
        raise ValueError(f"{field}: the prompt marks {len(marks)} image(s) with {mark!r} and {len(images)} were "
                         f"given; put one {mark!r} where each image goes")
    return ids, tuple(ImageInput.of(start, seq_len, tile) for start, tile in zip(starts, tiles))
