"""Cohere2 Vision's image processor in PIL (transformers 5.24 ships Cohere2VisionImageProcessor for torchvision only):
the grid of tiles HF's `get_optimal_tiled_canvas` picks, the image resized to it (bicubic) and cut row by row into
tiles of `size`, a thumbnail of the whole image last when there is more than one tile, each tile rescaled and
normalized with the processor's mean and std.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

# Cohere2VisionImageProcessor's defaults (OpenAI CLIP's mean and std)
DEFAULTS = dict(size={"height": 512, "width": 512}, min_patches=1, max_patches=12, crop_to_patches=True,
                image_mean=[0.48145466, 0.4578275, 0.40821073], image_std=[0.26862954, 0.26130258, 0.27577711],
                rescale_factor=1 / 255, do_rescale=True, do_normalize=True, resample=3)


def grids(max_tiles: int) -> list[tuple[int, int]]:
    """(columns, rows) of every grid of at most max_tiles tiles, by tile count (HF's order within a count)."""
    found = [(w, h) for w in range(1, max_tiles + 1) for h in range(1, max_tiles + 1) if w * h <= max_tiles]
    return sorted(found, key=lambda grid: grid[0] * grid[1])


def best_grid(height: int, width: int, tile: int, max_tiles: int) -> tuple[int, int]:
    """(columns, rows): the grid whose smaller side scale to cover the image is least at or above 1 (no shrinking),
    else the largest below 1 (HF's get_optimal_tiled_canvas; min_patches plays no part there either)."""
    options = grids(max_tiles)
    scales = (np.array(options) * tile / np.array([width, height])).min(axis=-1)
    if np.all(scales < 1):
        return options[int(np.argmax(scales))]
    return options[int(np.argmin(np.where(scales < 1, 1e10, scales)))]


class Cohere2VisionTiles:
    """Tiles [N, C, S, S] float32 of one image, the thumbnail last, from a checkpoint's preprocessor_config.json."""

    def __init__(self, settings: dict[str, Any]):
        merged = {**DEFAULTS, **{k: v for k, v in settings.items() if k in DEFAULTS}}
        if merged["size"].get("height") != merged["size"].get("width"):
            raise ValueError(f"preprocessor_config.json size {merged['size']} is not supported; supported: square "
                             "tiles")
        self.tile, self.max_tiles = int(merged["size"]["height"]), int(merged["max_patches"])
        self.crop, self.resample = bool(merged["crop_to_patches"]), int(merged["resample"])
        self.scale = float(merged["rescale_factor"]) if merged["do_rescale"] else 1.0
        mean, std = (merged["image_mean"], merged["image_std"]) if merged["do_normalize"] else ([0.0] * 3, [1.0] * 3)
        self.mean, self.std = np.asarray(mean, np.float32), np.asarray(std, np.float32)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> "Cohere2VisionTiles":
        """The checkpoint's settings (its preprocessor_config.json)."""
        return cls(json.loads((Path(model_dir) / "preprocessor_config.json").read_text()))

    def pixels(self, image: Any) -> np.ndarray:
        """One tile [C, S, S]: an S x S PIL image rescaled and normalized."""
        x = np.asarray(image.convert("RGB"), np.float32) * self.scale
        return ((x - self.mean) / self.std).transpose(2, 0, 1)

    def __call__(self, image: Any, **_: Any) -> dict[str, np.ndarray]:
        """{"pixel_values": tiles [N, C, S, S], "num_patches": [N]} of one PIL image (the calling convention of HF's
        processors, whose keyword arguments it takes and ignores)."""
        S = self.tile
        cols, rows = best_grid(image.height, image.width, S, self.max_tiles) if self.crop else (1, 1)
        whole = image.convert("RGB").resize((cols * S, rows * S), self.resample)
        tiles = [whole.crop((c * S, r * S, (c + 1) * S, (r + 1) * S)) for r in range(rows) for c in range(cols)]
        if len(tiles) > 1:
            tiles.append(image.convert("RGB").resize((S, S), self.resample))
        return {"pixel_values": np.stack([self.pixels(t) for t in tiles]), "num_patches": np.array([len(tiles)])}
