"""Qwen-VL videos as transformers' Qwen2VLVideoProcessor and Qwen3VLVideoProcessor make them, in NumPy and PIL
(transformers' video processors need torchvision, which jaxinfer does not).

A video comes as vLLM takes it: frames (a NumPy array [T, H, W, 3] uint8, or a list of PIL images or [H, W, 3]
arrays), or (frames, metadata) with the source's `fps`, `frames_indices` and `total_num_frames` (frames already
sampled, as vLLM's video loader gives them). Frames without metadata are sampled as the processor's
`do_sample_frames` says (Qwen3-VL's default: `fps` frames a second of a source taken to run at 24, at least
`min_frames`). Every frame is resized (bicubic) to the sides `smart_resize` gives (multiples of patch x merge pixels
within the processor's pixel bounds: per frame for Qwen2-VL, over the whole clip for Qwen3-VL), normalized, padded
to a multiple of `temporal_patch_size` frames with the last one, and cut into frame groups of merged blocks of
patches: [groups, blocks_h, blocks_w, merge², C * T * p * p], the tower's layout of an image per group.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

QWEN2_DEFAULTS = dict(size={"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768}, patch_size=14,
                      image_mean=[0.48145466, 0.4578275, 0.40821073], image_std=[0.26862954, 0.26130258, 0.27577711],
                      do_sample_frames=False, fps=None)
QWEN3_DEFAULTS = dict(size={"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768}, patch_size=16,
                      image_mean=[0.5] * 3, image_std=[0.5] * 3, do_sample_frames=True, fps=2)
VIDEO_PROCESSORS = {"Qwen2VLVideoProcessor": QWEN2_DEFAULTS, "Qwen3VLVideoProcessor": QWEN3_DEFAULTS}
MODEL_TYPES = {"qwen2_vl": "Qwen2VLVideoProcessor", "qwen2_5_vl": "Qwen2VLVideoProcessor",
               "qwen3_vl": "Qwen3VLVideoProcessor", "qwen3_vl_moe": "Qwen3VLVideoProcessor"}
ASSUMED_FPS = 24.0  # transformers' frame rate for frames given without metadata


@dataclasses.dataclass(frozen=True)
class Video:
    """One video's frames and where they came from."""

    frames: np.ndarray  # [T, H, W, 3] uint8
    fps: float | None  # the source's frame rate (None: unknown)
    frames_indices: tuple[int, ...]  # each frame's index in the source
    total_num_frames: int  # the source's
    given: bool = False  # frames with metadata: sampled already, kept as they are

    @property
    def sampled_fps(self) -> float:
        """Frames a second of the frames kept (transformers' VideoMetadata.sampled_fps)."""
        if self.fps is None:
            return ASSUMED_FPS
        return len(self.frames_indices) / self.total_num_frames * self.fps


@dataclasses.dataclass(frozen=True)
class VideoProcessor:
    """The checkpoint's video processor settings (video_preprocessor_config.json, else preprocessor_config.json)."""

    qwen3: bool  # Qwen3VLVideoProcessor: the pixel bounds cover the whole clip, linspace sampling, timestamps
    min_pixels: int
    max_pixels: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    rescale_factor: float
    do_resize: bool
    do_rescale: bool
    do_normalize: bool
    resample: int
    do_sample_frames: bool
    fps: float | None
    num_frames: int | None
    min_frames: int
    max_frames: int

    @property
    def factor(self) -> int:
        """The pixels a side's length is a multiple of."""
        return self.patch_size * self.merge_size


def processor_class(raw: Mapping[str, Any], model_type: str) -> str:
    """The video processor class transformers' AutoVideoProcessor picks: the file's `video_processor_type`, its image
    processor's name with Video for Image, or the model type's."""
    named = raw.get("video_processor_type") or \
        str(raw.get("image_processor_type") or "").replace("ImageProcessor", "VideoProcessor")
    return named if named in VIDEO_PROCESSORS else MODEL_TYPES.get(model_type, named)


def read_video_processor(model_dir: Path, model_type: str) -> VideoProcessor:
    """The settings transformers' AutoVideoProcessor would load (video_preprocessor_config.json, else
    preprocessor_config.json); ValueError naming one it cannot follow."""
    path = Path(model_dir) / "video_preprocessor_config.json"
    path = path if path.is_file() else Path(model_dir) / "preprocessor_config.json"
    raw = json.loads(path.read_text()) if path.is_file() else {}
    name = processor_class(raw, model_type)
    if name not in VIDEO_PROCESSORS:
        raise ValueError(f"{path}: video processor {name!r} is not supported; supported: {sorted(VIDEO_PROCESSORS)}")
    qwen3 = name == "Qwen3VLVideoProcessor"
    merged = {**VIDEO_PROCESSORS[name], **raw}
    size = dict(merged["size"] or {})
    if not qwen3:  # Qwen2VLVideoProcessor reads min_pixels / max_pixels over its size
        size["shortest_edge"] = merged.get("min_pixels") or size.get("shortest_edge")
        size["longest_edge"] = merged.get("max_pixels") or size.get("longest_edge")
    for flag in ("cap_pixels_per_frame", "do_center_crop"):
        if merged.get(flag):
            raise ValueError(f"{path}: {flag} true is not supported for videos; set it false")
    return VideoProcessor(
        qwen3=qwen3, min_pixels=int(size["shortest_edge"]), max_pixels=int(size["longest_edge"]),
        patch_size=int(merged["patch_size"]), temporal_patch_size=int(merged.get("temporal_patch_size") or 2),
        merge_size=int(merged.get("merge_size") or 2), mean=tuple(merged["image_mean"]), std=tuple(merged["image_std"]),
        rescale_factor=float(merged.get("rescale_factor", 1 / 255)), do_resize=bool(merged.get("do_resize", True)),
        do_rescale=bool(merged.get("do_rescale", True)), do_normalize=bool(merged.get("do_normalize", True)),
        resample=int(merged.get("resample", 3)), do_sample_frames=bool(merged["do_sample_frames"]),
        fps=merged.get("fps"), num_frames=merged.get("num_frames"), min_frames=int(merged.get("min_frames", 4)),
        max_frames=int(merged.get("max_frames", 768)),
    )


def as_frames(data: Any, field: str) -> np.ndarray:
    """[T, H, W, 3] uint8 frames of an array [T, H, W, 3] or a list of PIL images / [H, W, 3] arrays."""
    from PIL import Image

    if isinstance(data, np.ndarray) and data.ndim == 4:
        items = list(data)
    elif isinstance(data, Sequence) and not isinstance(data, str) and len(data) > 0:
        items = list(data)
    else:
        raise TypeError(f"{field} must be frames: a NumPy array [T, H, W, 3] or a list of PIL images or [H, W, 3] "
                        f"arrays, got {type(data).__name__}")
    frames = []
    for i, item in enumerate(items):
        if isinstance(item, np.ndarray) and item.ndim == 3:
            item = Image.fromarray(np.asarray(item, np.uint8))
        if not isinstance(item, Image.Image):
            raise TypeError(f"{field}[{i}] must be a PIL image or an [H, W, 3] array, got {type(item).__name__}")
        frames.append(np.asarray(item.convert("RGB")))
    if len({f.shape for f in frames}) != 1:
        raise ValueError(f"{field}: frames of different sizes {sorted({f.shape[:2] for f in frames})}")
    return np.stack(frames)


def is_one_video(data: Any) -> bool:
    """Whether `multi_modal_data["video"]` is one video (frames, or (frames, metadata)) rather than a list of them."""
    if isinstance(data, np.ndarray):
        return True
    if isinstance(data, tuple) and len(data) == 2 and isinstance(data[1], Mapping):
        return True
    return not (isinstance(data, Sequence) and data and (isinstance(data[0], (list, tuple)) or
                                                           (isinstance(data[0], np.ndarray) and data[0].ndim == 4)))


def as_videos(data: Any, field: str) -> list[Video]:
    """vLLM's `multi_modal_data["video"]`: one video or a list, each frames or (frames, metadata)."""
    items = [data] if is_one_video(data) else list(data)
    videos = []
    for i, item in enumerate(items):
        where = field if is_one_video(data) else f"{field}[{i}]"
        metadata = None
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Mapping):
            item, metadata = item
        frames = as_frames(item, where)
        videos.append(with_metadata(frames, metadata, where))
    return videos


def with_metadata(frames: np.ndarray, metadata: Mapping[str, Any] | None, field: str) -> Video:
    """A Video of frames and vLLM's metadata dict (fps, frames_indices, total_num_frames), or none."""
    if metadata is None:
        return Video(frames, None, tuple(range(len(frames))), len(frames))
    indices = tuple(int(i) for i in metadata.get("frames_indices") or range(len(frames)))
    if len(indices) != len(frames):
        raise ValueError(f"{field}: metadata's frames_indices name {len(indices)} frames, {len(frames)} were given")
    fps = metadata.get("fps")
    if fps is not None and not float(fps) > 0:
        raise ValueError(f"{field}: metadata's fps {fps!r} must be positive")
    total = int(metadata.get("total_num_frames") or max(indices) + 1)
    return Video(frames, None if fps is None else float(fps), indices, total, given=True)


def sample(video: Video, processor: VideoProcessor, field: str) -> Video:
    """The frames the processor keeps of frames given without metadata (`do_sample_frames`), as transformers'
    sample_frames picks them; frames with metadata were sampled already and are kept."""
    total = len(video.frames)
    if not processor.do_sample_frames or video.given:
        return video
    if processor.qwen3:
        indices = qwen3_indices(total, processor)
        return Video(video.frames[indices], ASSUMED_FPS, tuple(int(i) for i in indices), total)
    if processor.num_frames is None:
        if processor.fps is not None:
            raise ValueError(f"{field}: the video processor samples {processor.fps} frames a second, which needs the "
                             "video's frame rate; pass (frames, {'fps': ...}) or frames already sampled")
        return video
    step = processor.temporal_patch_size
    count = round(processor.num_frames / step) * step
    if count > total:
        raise ValueError(f"{field}: the video processor samples {count} frames (num_frames), {total} were given")
    indices = np.arange(0, total, np.float32(total / count), dtype=np.float32).astype(np.int64)
    return Video(video.frames[indices], None, tuple(int(i) for i in indices), total)


def qwen3_indices(total: int, processor: VideoProcessor) -> np.ndarray:
    """Qwen3VLVideoProcessor.sample_frames of frames taken to run at 24 a second."""
    count = processor.num_frames
    if count is None and processor.fps is not None:
        count = min(max(int(total / ASSUMED_FPS * processor.fps), processor.min_frames), processor.max_frames, total)
    if count is None:
        count = min(max(total, processor.min_frames), processor.max_frames)
    return np.linspace(0, total - 1, count).round().astype(np.int64)


def resized_sides(frames: int, height: int, width: int, processor: VideoProcessor) -> tuple[int, int]:
    """(height, width) transformers' smart_resize gives: multiples of patch x merge pixels within the pixel
    bounds (Qwen3-VL's bounds are over all frames, rounded to frame groups)."""
    factor, low, high = processor.factor, processor.min_pixels, processor.max_pixels
    if processor.qwen3 and (height < factor or width < factor):
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"a video's aspect ratio must be smaller than 200, got {height} x {width}")
    step = processor.temporal_patch_size
    count, frames_bar = (frames, round(frames / step) * step) if processor.qwen3 else (1, 1)
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if frames_bar * h_bar * w_bar > high:
        beta = math.sqrt(count * height * width / high)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif frames_bar * h_bar * w_bar < low:
        beta = math.sqrt(low / (count * height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def video_patches(video: Video, processor: VideoProcessor) -> np.ndarray:
    """[groups, blocks_h, blocks_w, merge², C * T * p * p] float32: the processor's pixel_values_videos of one video,
    laid out by frame group and merged block."""
    from PIL import Image

    frames = video.frames
    if processor.do_resize:
        height, width = resized_sides(len(frames), frames.shape[1], frames.shape[2], processor)
        if (height, width) != frames.shape[1:3]:
            frames = np.stack([np.asarray(Image.fromarray(f).resize((width, height), processor.resample))
                               for f in frames])
    pixels = frames.astype(np.float32)
    if processor.do_normalize:  # transformers fuses the rescale into the mean and std
        scale = 1.0 / processor.rescale_factor if processor.do_rescale else 1.0
        pixels = (pixels - np.float32(scale) * np.asarray(processor.mean, np.float32)) / \
            (np.float32(scale) * np.asarray(processor.std, np.float32))
    elif processor.do_rescale:
        pixels = pixels * np.float32(processor.rescale_factor)
    step, p, m = processor.temporal_patch_size, processor.patch_size, processor.merge_size
    if len(pixels) % step:
        pixels = np.concatenate([pixels, np.repeat(pixels[-1:], step - len(pixels) % step, axis=0)])
    groups, height, width = len(pixels) // step, pixels.shape[1], pixels.shape[2]
    channels = pixels.shape[3]
    grid = pixels.transpose(0, 3, 1, 2).reshape(groups, step, channels, height // (p * m), m, p, width // (p * m), m, p)
    grid = grid.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(grid.reshape(groups, height // (p * m), width // (p * m), m * m, -1))


def group_timestamps(video: Video, step: int) -> list[float]:
    """Each frame group's time in seconds (Qwen3VLProcessor's: the mean of its first and last frame's)."""
    indices = list(video.frames_indices)
    indices += [indices[-1]] * (-len(indices) % step)
    fps = video.fps or ASSUMED_FPS
    times = [i / fps for i in indices]
    return [(times[i] + times[i + step - 1]) / 2 for i in range(0, len(times), step)]
