"""LLaVA-NeXT's and LLaVA-OneVision's image prompts: the image processor (LlavaNextImageProcessor,
LlavaOnevisionImageProcessor) makes each image's tiles, the base tile first, and its (height, width); each `<image>`
mark becomes as many `<image>` placeholders as HF's processor puts (`_get_number_of_features`: the base tile's
patches, the cropped grid's rows with a newline each, OneVision's grid resized down past `anyres_max_N`). The count
is the length of the image's `RowLayout` (models/llava_next.image_layout), so the rows and the placeholders agree by
construction. Every image is tiled, as HF's processors do for one prompt's images. Token ids already expanded (HF's
processor's) run as they are; OneVision's `<video>` is refused.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxinfer.engine.prompt_checks import encode_prompt
from jaxinfer.entrypoints.internvl_prompts import runs
from jaxinfer.models.llava_next import LlavaNextConfig, image_layout, tile_count
from jaxinfer.runtime.image_input import ImageInput, RowLayout


def processed(processor: Any, images: list[Any], cfg: LlavaNextConfig, field: str
              ) -> list[tuple[np.ndarray, tuple[int, int]]]:
    """Each image's (tiles [T, C, S, S], (height, width)); ValueError when the processor's grid or tile size is not
    the model's."""
    pins = tuple(tuple(int(x) for x in pin) for pin in getattr(processor, "image_grid_pinpoints", None) or ())
    if pins != cfg.grid_pinpoints:
        raise ValueError(f"{field}: the image processor's image_grid_pinpoints {[list(p) for p in pins]} differ from "
                         f"the model config's {[list(p) for p in cfg.grid_pinpoints]}; they must be the same grids")
    out = processor(images, return_tensors="np")
    v = cfg.vision
    pixels, sizes = np.asarray(out["pixel_values"], np.float32), np.asarray(out["image_sizes"])
    if pixels.shape[2:] != (v.num_channels, v.image_size, v.image_size):
        raise ValueError(f"{field}: the image processor made tiles of {pixels.shape[2:]} pixels; the tower takes "
                         f"{v.image_size} x {v.image_size} tiles of {v.num_channels} channels")
    made = []
    for tiles, (height, width) in zip(pixels, sizes):
        size = (int(height), int(width))
        made.append((tiles[: tile_count(cfg, size)], size))
    return made


def anyres_prompt(prompt: str | Sequence[int], images: list[Any], cfg: LlavaNextConfig, tokenizer: Any,
                  processor: Any, field: str) -> tuple[list[int], tuple[ImageInput, ...]]:
    """(ids with each `<image>` expanded to its image's placeholder count, one ImageInput per image: its tiles and
    their layout)."""
    ids = encode_prompt(prompt, tokenizer)
    if cfg.video_token_id is not None and cfg.video_token_id in ids:
        raise ValueError(f"{field}: the prompt holds the video token (id {cfg.video_token_id}); videos are not "
                         "supported (LLaVA-OneVision serves images only: send frames as images, one <image> each)")
    inputs = []
    for tiles, size in processed(processor, images, cfg, field):
        index, weight = image_layout(cfg, size)
        inputs.append((tiles, RowLayout(index, weight)))
    token = cfg.image_token_id
    found = runs(ids, token)
    lengths = [len(layout.index) for _, layout in inputs]
    if [n for _, n in found] == lengths and any(n > 1 for _, n in found):  # expanded already (HF's processor's ids)
        return ids, tuple(ImageInput.of(start, n, tiles, layout) for (start, n), (tiles, layout) in zip(found, inputs))
    if len(found) != len(images) or any(n != 1 for _, n in found):
        mark = tokenizer.convert_ids_to_tokens(token)
        raise ValueError(f"{field}: the prompt marks {sum(n for _, n in found)} image(s) with {mark!r} and "
                         f"{len(images)} were given; put one {mark!r} where each image goes")
    out, carried, previous = [], [], 0
    for (mark, _), (tiles, layout), length in zip(found, inputs, lengths):
        out += ids[previous:mark]
        carried.append(ImageInput.of(len(out), length, tiles, layout))
        out += [token] * length
        previous = mark + 1
    return out + ids[previous:], tuple(carried)
