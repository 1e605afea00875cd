"""InternVL's image prompts: the image processor (GotOcr2ImageProcessor, with `crop_to_patches` on as HF's
InternVLProcessor sets it) cuts each image into up to `max_patches` tiles at the tower's size, the grid chosen by
the image's aspect ratio, plus a thumbnail of the whole image last when there is more than one tile. Each
`<IMG_CONTEXT>` mark in the prompt becomes HF's InternVLProcessor text: `<img>`, `image_seq_len` `<IMG_CONTEXT>` per
tile, `</img>`. The tiles of an image sit end to end in one run; each tile is its own `ImageInput` over its part of
it (so a request's tiles go through the tower together and chunked prefill, prefix keys and preemption need nothing
new). Token ids already expanded (HF's processor's) run as they are. Videos are refused.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxinfer.engine.prompt_checks import encode_prompt
from jaxinfer.models.internvit import InternViTConfig
from jaxinfer.models.internvl_vision import InternVLVisionConfig
from jaxinfer.models.vision_tower import VisionConfig
from jaxinfer.runtime.image_input import ImageInput

START, END, CONTEXT, VIDEO = "<img>", "</img>", "<IMG_CONTEXT>", "<video>"


def image_tiles(processor: Any, image: Any, v: InternViTConfig | VisionConfig, field: str) -> np.ndarray:
    """Tiles [N, C, S, S] of one image for a tower v (InternVL's, Aya Vision's), the thumbnail last; ValueError when
    the processor makes tiles the tower does not take."""
    tiles = np.asarray(processor(image, crop_to_patches=True, return_tensors="np")["pixel_values"], np.float32)
    if tiles.shape[1:] != (v.num_channels, v.image_size, v.image_size):
        raise ValueError(f"{field}: the image processor made tiles of {tiles.shape[1:]} pixels; the tower takes "
                         f"{v.image_size} x {v.image_size} tiles of {v.num_channels} channels (the processor's size "
                         "must be vision_config.image_size)")
    return tiles


def token_id(tokenizer: Any, token: str) -> int | None:
    """A special token's id, or None where the tokenizer does not hold it."""
    found = tokenizer.convert_tokens_to_ids(token)
    return None if found is None or found == tokenizer.unk_token_id else int(found)


def runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """(start, length) of each maximal run of `token` in ids."""
    out: list[tuple[int, int]] = []
    for i, t in enumerate(ids):
        if t != token:
            continue
        if out and out[-1][0] + out[-1][1] == i:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((i, 1))
    return out


def tile_inputs(start: int, tiles: np.ndarray, seq_len: int) -> list[ImageInput]:
    """One ImageInput per tile of an image whose run of rows starts at `start`."""
    return [ImageInput.of(start + k * seq_len, seq_len, tile) for k, tile in enumerate(tiles)]


def refuse_video(ids: list[int], tokenizer: Any, field: str) -> None:
    """ValueError when a prompt holds InternVL's video mark (videos are not served)."""
    video = token_id(tokenizer, VIDEO)
    if video is not None and video in ids:
        raise ValueError(f"{field}: the prompt holds {VIDEO!r}; videos are not supported (InternVL serves images "
                         "only: send frames as images, one <IMG_CONTEXT> each)")


def internvl_prompt(prompt: str | Sequence[int], images: list[Any], cfg: InternVLVisionConfig, tokenizer: Any,
                    processor: Any, field: str) -> tuple[list[int], tuple[ImageInput, ...]]:
    """(ids with each image's `<IMG_CONTEXT>` expanded to `<img>`, its tiles' rows and `</img>`, one ImageInput per
    tile)."""
    ids = encode_prompt(prompt, tokenizer)
    refuse_video(ids, tokenizer, field)
    made = [image_tiles(processor, image, cfg.vision, field) for image in images]
    token, seq_len = cfg.image_token_id, cfg.image_seq_len
    found = runs(ids, token)
    if [length for _, length in found] == [len(tiles) * seq_len for tiles in made] and any(n > 1 for _, n in found):
        return ids, tuple(i for (start, _), tiles in zip(found, made) for i in tile_inputs(start, tiles, seq_len))
    if len(found) != len(images) or any(length != 1 for _, length in found):
        raise ValueError(f"{field}: the prompt marks {sum(n for _, n in found)} image(s) with {CONTEXT!r} and "
                         f"{len(images)} were given; put one {CONTEXT!r} where each image goes")
    start, end = token_id(tokenizer, START), token_id(tokenizer, END)
    if start is None or end is None:
        raise ValueError(f"{field}: the tokenizer has no {START!r} / {END!r} tokens to put around an image")
    out, inputs, previous = [], [], 0
    for (mark, _), tiles in zip(found, made):
        out += ids[previous:mark] + [start]
        inputs += tile_inputs(len(out), tiles, seq_len)
        out += [token] * (len(tiles) * seq_len) + [end]
        previous = mark + 1
    return out + ids[previous:], tuple(inputs)
