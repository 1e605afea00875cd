"""Aya Vision's image prompts: the image processor (GotOcr2ImageProcessor, `crop_to_patches` on as HF's
AyaVisionProcessor passes it) cuts each image into tiles of the tower's size by aspect ratio, plus a thumbnail last
when there is more than one (InternVL's tiling: entrypoints/internvl_prompts). Each `<image>` of the prompt becomes
HF's AyaVisionProcessor text: `<|START_OF_IMG|>`, per tile but the thumbnail `TILE_i` (text) and `image_seq_len`
`<|IMG_PATCH|>`s, then `TILE_GLOBAL` and the thumbnail's, `<|END_OF_IMG|>`. A text prompt is expanded as text,
as HF's processor does (`<image>` need not be a token); ids are spliced where `<image>` is one. Each tile is its own
`ImageInput` over its own run of patches. Token ids already expanded (HF's processor's) run as they are.
"""

from __future__ import annotations

from typing import Any, Sequence

from jaxinfer.engine.prompt_checks import encode_prompt
from jaxinfer.entrypoints.idefics3_prompts import tile_runs
from jaxinfer.entrypoints.internvl_prompts import image_tiles, token_id
from jaxinfer.models.aya_vision import AyaVisionConfig
from jaxinfer.runtime.image_input import ImageInput

MARK, START, END, PATCH = "<image>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>"
TILE, GLOBAL = "TILE", "TILE_GLOBAL"


def image_text(tiles: int, seq_len: int) -> str:
    """HF's AyaVisionProcessor text for an image of `tiles` tiles (the thumbnail last; one tile: the thumbnail's
    place alone)."""
    patches = PATCH * seq_len
    return START + "".join(f"{TILE}_{i}{patches}" for i in range(1, tiles)) + f"{GLOBAL}{patches}{END}"


def expanded_ids(prompt: str | Sequence[int], counts: list[int], seq_len: int, tokenizer: Any) -> tuple[list, int]:
    """(ids with each `<image>` expanded, marks found); the ids as they are when the marks are not one per image."""
    if isinstance(prompt, str):
        parts = prompt.split(MARK)
        if len(parts) - 1 != len(counts):
            return encode_prompt(prompt, tokenizer), len(parts) - 1
        text = parts[0] + "".join(image_text(n, seq_len) + part for n, part in zip(counts, parts[1:]))
        return encode_prompt(text, tokenizer), len(counts)
    ids, mark = encode_prompt(prompt, tokenizer), token_id(tokenizer, MARK)
    marks = [i for i, t in enumerate(ids) if t == mark] if mark is not None else []
    if len(marks) != len(counts):
        return ids, len(marks)
    out, previous = [], 0
    for at, n in zip(marks, counts):
        out += ids[previous:at] + tokenizer.encode(image_text(n, seq_len), add_special_tokens=False)
        previous = at + 1
    return out + ids[previous:], len(marks)


def aya_vision_prompt(prompt: str | Sequence[int], images: list[Any], cfg: AyaVisionConfig, tokenizer: Any,
                      processor: Any, field: str) -> tuple[list[int], tuple[ImageInput, ...]]:
    """(ids with each image's `<image>` expanded to its tiles' layout, one ImageInput per tile)."""
    made = [image_tiles(processor, image, cfg.vision, field) for image in images]
    tiles = [tile for pixels in made for tile in pixels]
    seq_len = cfg.image_seq_len
    ids, marks = expanded_ids(prompt, [len(pixels) for pixels in made], seq_len, tokenizer)
    starts = tile_runs(ids, cfg.image_token_id, seq_len)
    if starts is None or len(starts) != len(tiles):
        raise ValueError(f"{field}: the prompt marks {marks} image(s) with {MARK!r} and {len(images)} were given; "
                         f"put one {MARK!r} where each image goes")
    return ids, tuple(ImageInput.of(start, seq_len, tile) for start, tile in zip(starts, tiles))
