"""A Qwen-VL or Pixtral tower's input padded to a bucket of merged blocks, so images of many sizes share a few
programs.

The image processor makes each image [blocks_h, blocks_w, merge², F] patches, its grid in the shape: one tower
program per distinct grid, compiled when an image of that size first comes (seconds on an accelerator, in a
request's time to first token). Here the grid becomes data: the patches go in flattened and padded with zero blocks
to `bucket_blocks(blocks_h * blocks_w)` (1, 2, 3, 4, 6, 8, 12, ...: at most 1.5x the image's own), with each patch's
(row, column) for the 2-D rotary, its window id (Qwen2.5-VL's window attention; one id for a whole image otherwise)
and, for Qwen3-VL, its four position-grid taps (GLM-4.xV: sixteen, bicubic); for Pixtral, whose placeholder run
puts an [IMG_BREAK] after each merged row (the last an [IMG_END]), where each row of the run comes from; for Gemma 4,
whose tower pools k x k squares by position, buckets of pooled rows. Padding patches take window id -1, so
every layer's mask keeps them apart from the image's (they attend among themselves and their rows are dropped): the
image's rows are the unpadded program's, the few programs are per bucket, not per grid.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

PAD_WINDOW = -1  # the window id of padding patches: never the image's


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TowerPatches:
    """One image's patches padded to a bucket: P = bucket blocks x merge² patches."""

    pixels: np.ndarray  # [1, P, F] float32
    rows: np.ndarray  # [P] int32: each patch's row in the patch grid (0 for padding)
    cols: np.ndarray  # [P] int32
    windows: np.ndarray  # [P] int32: attention window id (PAD_WINDOW for padding)
    grid_taps: np.ndarray | None = None  # Qwen3-VL: [P, 4] (GLM-4.xV: [P, 16]) int32 indices into its position grid
    grid_weights: np.ndarray | None = None  # [P, 4] float32 bilinear (GLM-4.xV: [P, 16] bicubic) weights; 0: padding
    run: np.ndarray | None = None  # Pixtral: [2 x bucket] int32, each placeholder's row of [image rows, break, end]


def bucket_blocks(blocks: int) -> int:
    """The smallest 2^k or 3 x 2^k merged blocks holding `blocks`."""
    power = 1 << max(blocks - 1, 0).bit_length()
    return power * 3 // 4 if power >= 4 and power * 3 // 4 >= blocks else power


def patch_grid(blocks_h: int, blocks_w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) [N] of each patch in the processor's order (merge blocks row-major, patches within)."""
    row = np.arange(blocks_h)[:, None, None, None] * merge + np.arange(merge)[None, None, :, None]
    col = np.arange(blocks_w)[None, :, None, None] * merge + np.arange(merge)[None, None, None, :]
    shape = (blocks_h, blocks_w, merge, merge)
    return np.broadcast_to(row, shape).reshape(-1), np.broadcast_to(col, shape).reshape(-1)


def window_ids(blocks_h: int, blocks_w: int, merge: int, window: int) -> np.ndarray:
    """[N] each patch's window of `window` x `window` merged blocks (Qwen2.5-VL), or 0 for all with window 0."""
    if window == 0:
        return np.zeros(blocks_h * blocks_w * merge ** 2, np.int32)
    block_row = np.repeat(np.arange(blocks_h) // window, blocks_w)
    block_col = np.tile(np.arange(blocks_w) // window, blocks_h)
    return np.repeat(block_row * blocks_w + block_col, merge ** 2).astype(np.int32)


def padded(values: np.ndarray, length: int, fill: float = 0) -> np.ndarray:
    """values [N, ...] with rows of `fill` after them up to `length`."""
    out = np.full((length, *values.shape[1:]), fill, values.dtype)
    out[: len(values)] = values
    return out


def interpolation(rows: np.ndarray, cols: np.ndarray, height: int, width: int, side: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(indices [N, 4] into the side x side grid, float32 weights [N, 4]): bilinear resampling with corners
    aligned (HF's `F.interpolate(align_corners=True)` as four taps) of each patch (row, col) of a height x width
    patch grid."""
    def taps(index: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
        floor = np.floor(src)
        at = floor[:, None] + np.arange(2, dtype=np.float32)
        return np.clip(at, 0, side - 1).astype(np.int32), np.maximum(1 - np.abs(src[:, None] - at), 0)

    row_taps, row_weights = taps(rows, height)
    col_taps, col_weights = taps(cols, width)
    indices = (row_taps[:, :, None] * side + col_taps[:, None, :]).reshape(-1, 4)
    return indices, (row_weights[:, :, None] * col_weights[:, None, :]).reshape(-1, 4).astype(np.float32)


def cubic_weights(t: np.ndarray) -> np.ndarray:
    """[N, 4] float32 weights of the taps at floor - 1 .. floor + 2 for fractions t [N]: torch's bicubic
    convolution (A = -0.75)."""
    a = np.float32(-0.75)
    near = lambda x: ((a + 2) * x - (a + 3)) * x * x + 1  # noqa: E731  |x| <= 1
    far = lambda x: ((a * x - 5 * a) * x + 8 * a) * x - 4 * a  # noqa: E731  1 < |x| < 2
    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=-1).astype(np.float32)


def bicubic_interpolation(rows: np.ndarray, cols: np.ndarray, height: int, width: int, side: int
                          ) -> tuple[np.ndarray, np.ndarray]:
    """(indices [N, 16] into the side x side grid, float32 weights [N, 16]): GLM-4.xV's resampling of each patch
    (row, col) of a height x width patch grid, HF's `F.grid_sample(mode="bicubic", align_corners=False,
    padding_mode="border")` at the patch's centre as sixteen taps (their indices clamped to the grid: border)."""
    def taps(index: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        normed = (index.astype(np.float32) + np.float32(0.5)) / np.float32(size) * 2 - 1  # float32, as HF's
        src = ((normed + 1) * np.float32(side) - 1) / 2
        floor = np.floor(src)
        at = floor[:, None] + np.arange(-1, 3, dtype=np.float32)
        return np.clip(at, 0, side - 1).astype(np.int32), cubic_weights((src - floor).astype(np.float32))

    row_taps, row_weights = taps(rows, height)
    col_taps, col_weights = taps(cols, width)
    indices = (row_taps[:, :, None] * side + col_taps[:, None, :]).reshape(-1, 16)
    return indices, (row_weights[:, :, None] * col_weights[:, None, :]).reshape(-1, 16).astype(np.float32)


def tower_patches(pixels: np.ndarray, merge: int, window: int = 0, grid_side: int = 0, bicubic: bool = False
                  ) -> TowerPatches:
    """The padded input of one image's patches [blocks_h, blocks_w, merge², F]; grid_side > 0 adds the taps of the
    learned grid_side x grid_side position grid: bilinear (Qwen3-VL) or bicubic (GLM-4.xV)."""
    blocks_h, blocks_w, per_block, features = pixels.shape
    length = bucket_blocks(blocks_h * blocks_w) * per_block
    rows, cols = patch_grid(blocks_h, blocks_w, merge)
    taps = weights = None
    if grid_side:
        resample = bicubic_interpolation if bicubic else interpolation
        indices, tap_weights = resample(rows, cols, blocks_h * merge, blocks_w * merge, grid_side)
        taps, weights = padded(indices.astype(np.int32), length), padded(tap_weights, length)
    return TowerPatches(
        pixels=padded(pixels.reshape(-1, features).astype(np.float32), length)[None],
        rows=padded(rows.astype(np.int32), length), cols=padded(cols.astype(np.int32), length),
        windows=padded(window_ids(blocks_h, blocks_w, merge, window), length, PAD_WINDOW),
        grid_taps=taps, grid_weights=weights,
    )


def pixtral_patches(pixels: np.ndarray, patch: int, merge: int) -> TowerPatches:
    """The padded input of one Pixtral image [C, H, W]: its patches (C * p * p pixels each, channel-major) in
    merge-block order, and its run: per merged row its blocks' rows then the break's (index bucket; the last row's
    the end's, bucket + 1), padded with the break's to 2 x bucket (a run holds at most 2 rows a block)."""
    channels, height, width = pixels.shape
    rows, cols = height // patch, width // patch
    grid = pixels.reshape(channels, rows, patch, cols, patch).transpose(1, 3, 0, 2, 4)
    blocks = grid.reshape(rows // merge, merge, cols // merge, merge, -1).transpose(0, 2, 1, 3, 4)
    patches = tower_patches(blocks.reshape(rows // merge, cols // merge, merge * merge, -1), merge)
    bucket = len(patches.rows) // merge ** 2
    block_ids = np.arange((rows // merge) * (cols // merge)).reshape(rows // merge, cols // merge)
    ends = np.full((rows // merge, 1), bucket)
    ends[-1] = bucket + 1
    run = np.concatenate([block_ids, ends], axis=1).reshape(-1).astype(np.int32)
    return dataclasses.replace(patches, run=padded(run, 2 * bucket, bucket))


def gemma4_patches(pixels: np.ndarray, patch: int, pool: int, most: int = 0) -> TowerPatches:
    """The padded input of one Gemma 4 image [C, H, W] (sides multiples of pool x patch pixels): its patches (p x p x C
    pixels each, row, column, channel order: HF's Gemma4ImageProcessor's) row-major, padded with zero patches to
    bucket_blocks(pooled rows) x pool² patches (at most `most` rows' worth when given: the processor's ceiling, HF's
    own padded length), each one's (row, column); padding's window PAD_WINDOW."""
    channels, height, width = pixels.shape
    rows, cols = height // patch, width // patch
    grid = pixels.reshape(channels, rows, patch, cols, patch).transpose(1, 3, 2, 4, 0).reshape(rows * cols, -1)
    pooled = rows * cols // pool ** 2
    length = max(min(bucket_blocks(pooled), most or pooled), pooled) * pool ** 2
    row, col = np.divmod(np.arange(rows * cols, dtype=np.int32), np.int32(cols))
    return TowerPatches(
        pixels=padded(grid.astype(np.float32), length)[None], rows=padded(row, length), cols=padded(col, length),
        windows=padded(np.zeros(rows * cols, np.int32), length, PAD_WINDOW),
    )
