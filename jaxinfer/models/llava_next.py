"""LLaVA-NeXT (llava-v1.6) and LLaVA-OneVision images: "anyres" tiles through LLaVA's tower and projector, laid out
as the image's grid.

The image processor resizes an image to the best of `image_grid_pinpoints` (HF's `select_best_resolution`), cuts it
into tower-size tiles and puts the whole image, resized to one tile, first. Every tile goes through LLaVA's tower
and projector (models/llava: rows = the tile's patch grid). An image's rows are then the base tile's, followed by the
tiles' grid of patch rows with the processor's padding cropped away (`unpad_image`) and `image_newline` after each
row of the grid. OneVision shrinks a grid larger than `anyres_max_N` tiles' worth of patches by a bilinear resize
(`vision_aspect_ratio`). Every image of a prompt is tiled, as HF's processors do for a prompt's flat list of images
(OneVision's base-tile-only rule for a nested list of several images is not taken).

The tower runs per tile (one program per tile count); which tile row lands on which placeholder is plain host data
(`image_layout`: per placeholder up to 4 source rows and weights, the newline a row of its own), so an image of any
size needs no program of its own.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Mapping

import jax
import numpy as np

from jaxinfer.config.model import ConfigError
from jaxinfer.models.llava import LlavaConfig, LlavaWeights, abstract_llava, complete_config, read_llava_config
from jaxinfer.models.vision_tower import read_vision_config
from jaxinfer.parallel.array_info import ArrayInfo

NEXT, ONEVISION = "LlavaNextForConditionalGeneration", "LlavaOnevisionForConditionalGeneration"
ARCHITECTURES = (NEXT, ONEVISION)
ASPECT_RATIO = re.compile(r"anyres_max_(\d+)")


@dataclasses.dataclass(frozen=True)
class LlavaNextConfig(LlavaConfig):
    """LLaVA's tower, features and projector (per tile), and how an image's tiles are chosen and laid out."""

    grid_pinpoints: tuple[tuple[int, int], ...] = ()  # (height, width) resolutions an image may be resized to
    max_tiles: int = 0  # OneVision's anyres_max_N: grids over N tiles' patches are resized down; 0: never (NeXT)
    video_token_id: int | None = None  # OneVision's <video> (refused)

    @property
    def side(self) -> int:
        """Patches along a tile's side."""
        return self.vision.image_size // self.vision.patch_size


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LlavaNextWeights(LlavaWeights):
    """LLaVA's tower and projector, and the row that ends each row of an image's grid."""

    newline: jax.Array = None  # [D] image_newline


def abstract_llava_next(cfg: LlavaNextConfig) -> LlavaNextWeights:
    """Every tower and projector leaf, and the newline row, as an ArrayInfo."""
    llava = abstract_llava(cfg)
    return LlavaNextWeights(llava.tower, llava.projector, ArrayInfo((cfg.text_hidden_size,), (None,)))


def best_resolution(size: tuple[int, int], pinpoints: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """HF's `select_best_resolution`: the (height, width) keeping most of the image, then wasting least."""
    height, width = size
    best, most, least = pinpoints[0], 0, math.inf
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        if kept > most or (kept == most and h * w - kept < least):
            best, most, least = (h, w), kept, h * w - kept
    return best


def tile_grid(cfg: LlavaNextConfig, size: tuple[int, int]) -> tuple[int, int]:
    """(rows, columns) of tiles an image of (height, width) is cut into."""
    height, width = best_resolution(size, cfg.grid_pinpoints)
    return height // cfg.vision.image_size, width // cfg.vision.image_size


def tile_count(cfg: LlavaNextConfig, size: tuple[int, int]) -> int:
    """Tiles through the tower for one image: the base tile and its grid."""
    rows, cols = tile_grid(cfg, size)
    return 1 + rows * cols


def unpadded(grid: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """HF's `unpad_image` on a [H, W] grid: the rows (or columns) the processor padded cropped off both sides."""
    height, width = size
    current_height, current_width = grid.shape
    if width / height > current_width / current_height:
        new_height = int(round(height * (current_width / width), 7))
        padding = (current_height - new_height) // 2
        return grid[padding : current_height - padding]
    new_width = int(round(width * (current_height / height), 7))
    padding = (current_width - new_width) // 2
    return grid[:, padding : current_width - padding]


def bilinear_taps(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first, second, second's weight) source index per output index of torch's bilinear resize
    (`align_corners=False`), in float32 as torch computes it for float32 input."""
    scale = np.float32(size_in) / np.float32(size_out)
    source = np.maximum((np.arange(size_out, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5), 0)
    first = np.minimum(np.floor(source).astype(np.int64), size_in - 1)
    weight = np.clip(source - first, 0, 1).astype(np.float32)
    return first, np.minimum(first + 1, size_in - 1), weight


def resized(grid: np.ndarray, ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """A grid of source rows [H, W] bilinearly resized to [H // ratio, W // ratio]: ([h, w, 4] rows, [h, w, 4]
    weights), OneVision's `interpolate(..., mode="bilinear")`."""
    (h0, h1, hw), (w0, w1, ww) = (bilinear_taps(n, int(n // ratio)) for n in grid.shape)
    index = np.stack([grid[h0][:, w0], grid[h0][:, w1], grid[h1][:, w0], grid[h1][:, w1]], -1)
    top, left = (1 - hw)[:, None], (1 - ww)[None, :]
    weight = np.stack([top * left, top * ww[None, :], hw[:, None] * left, hw[:, None] * ww[None, :]], -1)
    return index, weight.astype(np.float32)


def image_layout(cfg: LlavaNextConfig, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Where each of an image's placeholder rows comes from: ([L, K] source rows, [L, K] weights), source rows
    numbering the image's tiles' rows end to end (base tile first) and then the newline (one past them). L is the
    image's placeholder count, HF's processor's `_get_number_of_features`."""
    side, patches = cfg.side, cfg.side ** 2
    newline = tile_count(cfg, size) * patches
    rows, cols = tile_grid(cfg, size)
    r, c = np.arange(rows * side)[:, None], np.arange(cols * side)[None, :]
    grid = unpadded((1 + r // side * cols + c // side) * patches + r % side * side + c % side, size)
    ratio = math.sqrt(grid.size / (cfg.max_tiles * patches)) if cfg.max_tiles else 0.0
    index, weight = resized(grid, ratio) if ratio > 1.1 else (grid[..., None], np.ones((*grid.shape, 1), np.float32))
    taps = index.shape[-1]
    ends = np.zeros((index.shape[0], 1, taps), np.int64) + newline, np.eye(1, taps, dtype=np.float32)[None]
    index = np.concatenate([index, ends[0]], 1).reshape(-1, taps)
    weight = np.concatenate([weight, np.broadcast_to(ends[1], (weight.shape[0], 1, taps))], 1).reshape(-1, taps)
    base = np.zeros((patches, taps), np.int64) + np.arange(patches)[:, None]
    return np.concatenate([base, index]), np.concatenate([np.eye(1, taps, dtype=np.float32).repeat(patches, 0), weight])


def _pinpoints(value: Any, tile: int) -> tuple[tuple[int, int], ...]:
    """image_grid_pinpoints as (height, width) pairs, each a multiple of the tile size; ConfigError naming it."""
    try:
        pins = tuple((int(h), int(w)) for h, w in value)
    except (TypeError, ValueError):
        pins = ()
    if not pins or any(h <= 0 or w <= 0 or h % tile or w % tile for h, w in pins):
        raise ConfigError(f"image_grid_pinpoints {value!r} is not supported; supported: a list of [height, width] "
                          f"pairs, each a positive multiple of vision_config.image_size {tile}")
    return pins


def _max_tiles(value: Any) -> int:
    """OneVision's vision_aspect_ratio 'anyres_max_N' as N; ConfigError naming it."""
    found = ASPECT_RATIO.fullmatch(str(value))
    if found is None or int(found.group(1)) < 1:
        raise ConfigError(f"vision_aspect_ratio {value!r} is not supported; supported: 'anyres_max_N' (N >= 1)")
    return int(found.group(1))


def read_llava_next_config(hf: Mapping[str, Any]) -> LlavaNextConfig:
    """A LlavaNextConfig from an HF LLaVA-NeXT or LLaVA-OneVision config; ConfigError naming a field it cannot run."""
    onevision = hf["architectures"][0] == ONEVISION
    full = complete_config({**hf, "model_type": hf.get("model_type", "llava_onevision" if onevision else "llava_next")})
    vision = read_vision_config(full["vision_config"])
    strategy = full.get("vision_feature_select_strategy")
    if strategy != ("default" if vision.class_token else "full"):  # rows a tile must be its patch grid
        accepted = "'default' (a CLIP tower: its class token dropped)" if vision.class_token else \
            "'full' (a SigLIP tower: every patch kept)"
        raise ConfigError(f"vision_feature_select_strategy {strategy!r} is not supported with a "
                          f"{full['vision_config']['model_type']} tower: an image's grid needs one row per patch; "
                          f"supported: {accepted}")
    llava = read_llava_config({**full, "image_seq_length": vision.num_patches})
    return LlavaNextConfig(
        **{f.name: getattr(llava, f.name) for f in dataclasses.fields(LlavaConfig)},
        grid_pinpoints=_pinpoints(full.get("image_grid_pinpoints"), vision.image_size),
        max_tiles=_max_tiles(full.get("vision_aspect_ratio", "anyres_max_9")) if onevision else 0,
        video_token_id=full.get("video_token_index", full.get("video_token_id")) if onevision else None,
    )
