"""Idefics3's and SmolVLM's image prompts: the processor (Idefics3ImageProcessor) cuts each image into rows x cols
tiles of `max_image_size` pixels and adds the whole image resized to one tile (with `do_image_splitting` false, or
an image within one tile, only that one: rows = cols = 0); the prompt's `<image>` becomes HF's
Idefics3Processor / SmolVLMProcessor text: per tile `<fake_token_around_image><row_r_col_c>` and `image_seq_len`
`<image>`s, a newline after each row of tiles, then a newline, `<fake_token_around_image><global-img>`, the global
tile's `<image>`s and a closing `<fake_token_around_image>`. Each tile is one `ImageInput` over its own `<image>`
run (the marks between runs are text). Token ids already expanded (HF's processor's) run as they are.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxinfer.engine.prompt_checks import encode_prompt
from jaxinfer.models.idefics3_vision import Idefics3VisionConfig
from jaxinfer.runtime.image_input import ImageInput

FAKE, GLOBAL, IMAGE = "<fake_token_around_image>", "<global-img>", "<image>"


def image_tiles(processor: Any, image: Any, cfg: Idefics3VisionConfig, field: str) -> tuple[np.ndarray, int, int]:
    """(tiles [N, C, S, S] with the global image last, rows, cols) of one image; ValueError when the processor
    makes tiles the tower does not take."""
    made = processor(image, return_row_col_info=True, return_tensors="np")
    tiles = np.asarray(made["pixel_values"], np.float32)[0]
    rows, cols = int(np.asarray(made["rows"]).reshape(-1)[0]), int(np.asarray(made["cols"]).reshape(-1)[0])
    v = cfg.vision
    if tiles.shape[1:] != (v.num_channels, v.image_size, v.image_size) or len(tiles) != rows * cols + 1:
        raise ValueError(f"{field}: the image processor made {len(tiles)} tiles of {tiles.shape[1:]} pixels for "
                         f"{rows} x {cols} splits; the tower takes {v.image_size} x {v.image_size} tiles of "
                         f"{v.num_channels} channels (max_image_size must be vision_config.image_size)")
    return tiles, rows, cols


def image_text(rows: int, cols: int, seq_len: int) -> str:
    """HF's expansion of one `<image>` for an image cut into rows x cols tiles (0 x 0: the global image alone)."""
    run = IMAGE * seq_len
    tiles = "".join("".join(f"{FAKE}<row_{r + 1}_col_{c + 1}>{run}" for c in range(cols)) + "\n" for r in range(rows))
    return tiles + ("\n" if rows or cols else "") + f"{FAKE}{GLOBAL}{run}{FAKE}"


def tile_runs(ids: list[int], token: int, seq_len: int) -> list[int] | None:
    """Where each run of `seq_len` image tokens starts, or None when some run has another length."""
    starts = [i for i, t in enumerate(ids) if t == token and (i == 0 or ids[i - 1] != token)]
    if any(ids[s : s + seq_len] != [token] * seq_len or ids[s + seq_len : s + seq_len + 1] == [token]
           for s in starts):
        return None
    return starts


def idefics3_prompt(prompt: str | Sequence[int], images: list[Any], cfg: Idefics3VisionConfig, tokenizer: Any,
                    processor: Any, field: str) -> tuple[list[int], tuple[ImageInput, ...]]:
    """(ids with each image's `<image>` expanded to its tiles' layout, one ImageInput per tile)."""
    ids = encode_prompt(prompt, tokenizer)
    made = [image_tiles(processor, image, cfg, field) for image in images]
    tiles = [tile for pixels, _, _ in made for tile in pixels]
    token, seq_len = cfg.image_token_id, cfg.image_seq_len
    marks = [i for i, t in enumerate(ids) if t == token]
    if len(marks) != len(images):
        starts = tile_runs(ids, token, seq_len) if len(marks) == len(tiles) * seq_len else None
        if starts is None:
            raise ValueError(f"{field}: the prompt marks {len(marks)} image(s) with {IMAGE!r} and {len(images)} "
                             f"were given; put one {IMAGE!r} where each image goes")
        return ids, tuple(ImageInput.of(s, seq_len, tile) for s, tile in zip(starts, tiles))
    out, previous = [], 0
    for mark, (_, rows, cols) in zip(marks, made):
        out += ids[previous:mark] + tokenizer.encode(image_text(rows, cols, seq_len), add_special_tokens=False)
        previous = mark + 1
    out += ids[previous:]
    starts = tile_runs(out, token, seq_len)
    return out, tuple(ImageInput.of(s, seq_len, tile) for s, tile in zip(starts, tiles))
