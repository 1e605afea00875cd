"""PaliGemma's image prompts as HF's PaliGemmaProcessor builds them: the image tokens first (a prompt without
`<image>` marks gets one per image in front, as vLLM's `{"prompt": "caption en", "multi_modal_data": ...}` does),
then bos, the text and "\\n" (bos after the last mark where the prompt has marks), each mark expanded to
`image_seq_length` image tokens and the whole tokenized without added specials. Token ids run as HF's processor
returned them (its expanded image tokens, bos and "\\n" already in).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxinfer.models.paligemma_vision import PaliGemmaConfig
from jaxinfer.runtime.image_input import ImageInput


def processor_text(prompt: str, count: int, mark: str, bos: str, field: str) -> str:
    """HF's PaliGemmaProcessor layout of a text prompt with `count` images (marks not yet expanded)."""
    marks = prompt.count(mark)
    if marks == 0:
        return f"{mark * count}{bos}{prompt}\n"
    if marks != count:
        raise ValueError(f"{field}: the prompt marks {marks} image(s) with {mark!r} and {count} were given; put one "
                         f"{mark!r} per image, or none (they go first)")
    end = prompt.rfind(mark) + len(mark)
    return f"{prompt[:end]}{bos}{prompt[end:]}\n"


def image_offsets(ids: list[int], count: int, cfg: PaliGemmaConfig) -> list[int] | None:
    """Each image's first placeholder where ids hold `count` runs of image_seq_length image tokens; else None."""
    marks = [i for i, t in enumerate(ids) if t == cfg.image_token_id]
    length = cfg.image_seq_length
    if len(marks) != count * length:
        return None
    starts = marks[::length]
    if any(marks[k * length + length - 1] - start != length - 1 for k, start in enumerate(starts)):
        return None
    return starts


def paligemma_prompt(prompt: str | Sequence[int], images: list[Any], cfg: PaliGemmaConfig, tokenizer: Any,
                     processor: Any, field: str) -> tuple[list[int], tuple[ImageInput, ...]]:
    """(ids as HF's processor makes them, each image's ImageInput); ValueError naming what does not fit."""
    mark = tokenizer.convert_ids_to_tokens(cfg.image_token_id)
    if isinstance(prompt, str):
        text = processor_text(prompt, len(images), mark, tokenizer.bos_token, field)
        ids = tokenizer.encode(text.replace(mark, mark * cfg.image_seq_length), add_special_tokens=False)
    else:
        ids = [int(t) for t in prompt]
    offsets = image_offsets(ids, len(images), cfg)
    if offsets is None:
        raise ValueError(f"{field}: token ids must hold {cfg.image_seq_length} {mark!r} tokens per image, as HF's "
                         "PaliGemmaProcessor returns them; or send the prompt as text")
    pixels = processor(images, return_tensors="np")["pixel_values"]
    v = cfg.vision
    if pixels.shape[1:] != (v.num_channels, v.image_size, v.image_size):
        raise ValueError(f"{field}: the image processor made {pixels.shape[1:]} pixels, the tower takes "
                         f"{(v.num_channels, v.image_size, v.image_size)}")
    pixels = np.asarray(pixels, np.float32)
    return ids, tuple(ImageInput.of(offset, cfg.image_seq_length, p) for offset, p in zip(offsets, pixels))
