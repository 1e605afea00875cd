"""Qwen-VL prompts with videos (vLLM's `multi_modal_data["video"]`): each video's one `<|video_pad|>` (inside
`<|vision_start|>` ... `<|vision_end|>`, as Qwen's chat templates write it) becomes its tokens as HF's processors put
them, and its frame groups' patches become the inputs the engine carries.

- Qwen2-VL / Qwen2.5-VL (Qwen2VLProcessor): the pad becomes one pad per merged block of every frame group, one input
  over all of them whose frame groups step the temporal rotary stream by 1 (Qwen2-VL) or by tokens_per_second x
  temporal_patch_size / fps (Qwen2.5-VL's second_per_grid_ts, truncated: HF's `get_vision_position_ids`).
- Qwen3-VL (Qwen3VLProcessor): per frame group, its timestamp as text (`<1.5 seconds>`), `<|vision_start|>`, its
  pads and `<|vision_end|>`: each group one input, placed and rotated as an image is.

Images in the same prompt are expanded as entrypoints/qwen2_vl_prompts does, in the order the marks come.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxinfer.engine.prompt_checks import encode_prompt
from jaxinfer.entrypoints.qwen2_vl_prompts import image_patches
from jaxinfer.entrypoints.qwen_video import Video, VideoProcessor, group_timestamps, sample, video_patches
from jaxinfer.models.qwen2_vl_vision import Qwen2VLConfig
from jaxinfer.models.qwen3_vl_vision import Qwen3VLConfig
from jaxinfer.runtime.image_input import ImageInput

Placement = tuple[list[int], list[tuple[int, np.ndarray, tuple[int, ...]]]]  # ids, (offset in ids, pixels, temporal)


def temporal_positions(video: Video, groups: int, cfg: Qwen2VLConfig, processor: VideoProcessor) -> tuple[int, ...]:
    """Each frame group's temporal rotary position past the video's start (float32 as HF computes it)."""
    if not cfg.tokens_per_second:
        return tuple(range(groups))
    seconds = np.float32(processor.temporal_patch_size / video.sampled_fps)  # second_per_grid_ts
    interval = np.float32(cfg.tokens_per_second) * seconds
    return tuple(int(t) for t in (np.arange(groups, dtype=np.float32) * interval).astype(np.int64))


def video_placement(video: Video, cfg: Qwen2VLConfig, tokenizer: Any, processor: VideoProcessor,
                    field: str) -> Placement:
    """What one video's pad becomes: its token ids and its inputs."""
    video = sample(video, processor, field)
    if processor.qwen3 and len(video.frames) < processor.temporal_patch_size:
        raise ValueError(f"{field}: a video of {len(video.frames)} frame(s); Qwen3-VL's video processor takes at "
                         f"least temporal_patch_size ({processor.temporal_patch_size})")
    patches = video_patches(video, processor)
    check_patches(patches, cfg, processor, field)
    groups, blocks_h, blocks_w = patches.shape[:3]
    if not isinstance(cfg, Qwen3VLConfig):
        ids = [cfg.video_token_id] * (groups * blocks_h * blocks_w)
        return ids, [(0, patches, temporal_positions(video, groups, cfg, processor))]
    ids, inputs = [], []
    for group, seconds in zip(patches, group_timestamps(video, processor.temporal_patch_size)):
        ids += tokenizer.encode(f"<{seconds:.1f} seconds>", add_special_tokens=False) + [cfg.vision_start_token_id]
        inputs.append((len(ids), group, ()))
        ids += [cfg.video_token_id] * (blocks_h * blocks_w) + [cfg.vision_end_token_id]
    return ids, inputs


def check_patches(patches: np.ndarray, cfg: Qwen2VLConfig, processor: VideoProcessor, field: str) -> None:
    """ValueError when the video processor's patches do not fit the tower."""
    v = cfg.vision
    if patches.shape[-1] != v.patch_dims or processor.merge_size != v.merge:
        raise ValueError(f"{field}: the video processor made patches of {patches.shape[-1]} values merged "
                         f"{processor.merge_size} x {processor.merge_size}; the tower takes {v.patch_dims} merged "
                         f"{v.merge} x {v.merge}")


def qwen_vl_video_prompt(prompt: str | Sequence[int], images: list[Any], videos: list[Video], cfg: Qwen2VLConfig,
                         tokenizer: Any, image_processor: Any, video_processor: VideoProcessor, field: str
                         ) -> tuple[list[int], tuple[ImageInput, ...]]:
    """(ids with each image's and video's pad expanded, their inputs as the engine carries them, in prompt order)."""
    ids = encode_prompt(prompt, tokenizer)
    placements = {cfg.image_token_id: [([cfg.image_token_id] * (p.shape[0] * p.shape[1]), [(0, p, ())])
                                       for p in (image_patches(image_processor, images, cfg, field) if images else [])],
                  cfg.video_token_id: [video_placement(v, cfg, tokenizer, video_processor, f"{field}.video[{i}]")
                                       for i, v in enumerate(videos)]}
    marks = [i for i, t in enumerate(ids) if t in placements]
    for token, given, kind in ((cfg.image_token_id, images, "image"), (cfg.video_token_id, videos, "video")):
        found = sum(ids[i] == token for i in marks)
        if found != len(given):
            pad = tokenizer.convert_ids_to_tokens(token)
            raise ValueError(f"{field}: the prompt marks {found} {kind}(s) with {pad!r} and {len(given)} were "
                             f"given; put one {pad!r} where each {kind} goes")
    queues = {token: iter(items) for token, items in placements.items()}
    out, carried, previous = [], [], 0
    for mark in marks:
        out += ids[previous:mark]
        replacement, inputs = next(queues[ids[mark]])
        for offset, pixels, temporal in inputs:
            length = int(np.prod(pixels.shape[:-2]))
            carried.append(ImageInput.of(len(out) + offset, length, pixels, temporal=temporal))
        out += replacement
        previous = mark + 1
    return out + ids[previous:], tuple(carried)
