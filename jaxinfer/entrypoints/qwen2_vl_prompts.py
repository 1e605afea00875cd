"""Qwen2-VL's image prompts: its processor resizes each image to multiples of patch * merge pixels (within the
checkpoint's min and max pixels), so each image has its own number of `<|image_pad|>` tokens, one per merged
2x2 block: the prompt's one pad per image (inside `<|vision_start|>` ... `<|vision_end|>`, as the chat template
writes it) is expanded to that many, as HF's Qwen2VLProcessor does. Token ids already expanded run as they are.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxinfer.engine.prompt_checks import encode_prompt
from jaxinfer.models.qwen2_vl_vision import Qwen2VLConfig
from jaxinfer.runtime.image_input import ImageInput


def image_patches(processor: Any, images: list[Any], cfg: Qwen2VLConfig, field: str) -> list[np.ndarray]:
    """Each image's patches [blocks_h, blocks_w, m*m, C*T*p*p] as the processor makes them; ValueError when its
    patches do not fit the tower."""
    out = processor(images, return_tensors="np")
    pixels, grids = np.asarray(out["pixel_values"], np.float32), np.asarray(out["image_grid_thw"])
    v, m = cfg.vision, cfg.vision.merge
    if pixels.shape[1] != v.patch_dims or getattr(processor, "merge_size", m) != m:
        raise ValueError(f"{field}: the image processor made patches of {pixels.shape[1]} values merged "
                         f"{getattr(processor, 'merge_size', m)} x {getattr(processor, 'merge_size', m)}; the tower "
                         f"takes {v.patch_dims} merged {m} x {m}")
    patches, start = [], 0
    for t, h, w in grids.tolist():
        if t != 1:
            raise ValueError(f"{field}: an image of {t} temporal patches (an image is one; videos come as "
                             "multi_modal_data['video'])")
        patches.append(pixels[start : start + h * w].reshape(h // m, w // m, m * m, -1))
        start += h * w
    return patches


def qwen2_vl_prompt(prompt: str | Sequence[int], images: list[Any], cfg: Qwen2VLConfig, tokenizer: Any,
                    processor: Any, field: str) -> tuple[list[int], tuple[ImageInput, ...]]:
    """(ids with each image's pad expanded to its merged blocks, the images as the engine carries them)."""
    ids = encode_prompt(prompt, tokenizer)
    patches = image_patches(processor, images, cfg, field)
    lengths = [p.shape[0] * p.shape[1] for p in patches]
    marks = [i for i, t in enumerate(ids) if t == cfg.image_token_id]
    if len(marks) == sum(lengths) and len(marks) != len(images):  # expanded already (HF's processor's ids)
        starts = np.cumsum([0] + lengths[:-1])
        runs = [marks[s : s + n] for s, n in zip(starts, lengths)]
        if all(run[-1] - run[0] == len(run) - 1 for run in runs):
            return ids, tuple(ImageInput.of(run[0], len(run), p) for run, p in zip(runs, patches))
    if len(marks) != len(images):
        pad = tokenizer.convert_ids_to_tokens(cfg.image_token_id)
        raise ValueError(f"{field}: the prompt marks {len(marks)} image(s) with {pad!r} and {len(images)} were "
                         f"given; put one {pad!r} where each image goes")
    out, carried, previous = [], [], 0
    for mark, length, p in zip(marks, lengths, patches):
        out += ids[previous:mark]
        carried.append(ImageInput.of(len(out), length, p))
        out += [cfg.image_token_id] * length
        previous = mark + 1
    return out + ids[previous:], tuple(carried)
