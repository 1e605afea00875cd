"""The vision tower beside the engine's steps: image features made once per image, and each ragged
step's rows for its placeholder tokens (runtime/embed_rows).

The tower runs as its own program (one per tower and image size: every image reaches it at the
size its model's processor makes; Qwen-VL, Pixtral and Gemma 4 images padded to a few sizes,
models/tower_patches) when a request with images is first scheduled; its rows go back
to the host and stay with the request (`Request.image_rows`: float32, tokens_per_image x D per
image, 9.4 MB for llava-1.5-7b's 576 x 4096; Qwen3-VL's: (1 + K) x D), so chunked prefill and recompute after preemption
never run it again. Recently encoded images are kept by content hash too (n > 1 samples, or the
same image in another request, are not encoded again). Idefics3's, Idefics2's, InternVL's, LLaVA-NeXT's and
OneVision's tiles, all one size (Idefics2's padded to it), go through together: a request's new tiles in one call of
the next power of two (up to MAX_TILES, zero tiles padding it), so its tower has at most five programs whatever
its images' tile counts (LLaVA-NeXT's and OneVision's rows then laid out on the host by each image's `RowLayout`).
A ragged step of a vision-language model always takes an `EmbedOverride` (so its programs are the same
with or without images): the rows its placeholder tokens read, or a device-resident empty one; where
an image's tokens see each other both ways (Gemma 3) it also carries each token's image end.
"""

from __future__ import annotations

import collections

import numpy as np

from jaxinfer.models.gemma4_vision import Gemma4VisionConfig
from jaxinfer.models.idefics2_vision import Idefics2Config, MaskedTiles, masked_tiles
from jaxinfer.models.pixtral_vision import Mistral3Config
from jaxinfer.models.qwen2_vl_vision import Qwen2VLConfig
from jaxinfer.models.tower_patches import TowerPatches, gemma4_patches, pixtral_patches, tower_patches
from jaxinfer.models.vision_language import (
    VisionLanguageConfig,
    VisionLanguageWeights,
    anyres,
    bidirectional,
    blank_pixels,
    deepstack_layers,
    tiled,
    whole_prompt,
)
from jaxinfer.parallel.sharding import Layout, to_host
from jaxinfer.runtime import step_programs
from jaxinfer.runtime.embed_rows import StepRows
from jaxinfer.runtime.executables import Executables, Program
from jaxinfer.runtime.image_input import ImageInput
from jaxinfer.runtime.mrope_positions import offsets

CACHED_IMAGES = 32  # encoded images kept by content hash (their rows are the request's anyway)
MAX_TILES = 16  # tiles one tower call takes (Idefics3, InternVL): a request's new tiles in calls of 1, 2, 4, 8 or 16


class VisionRunner:
    """A LLaVA (or Gemma 3) tower and projector on the device, its program run through the engine's table."""

    def __init__(self, cfg: VisionLanguageConfig, weights: VisionLanguageWeights, layout: Layout,
                 executables: Executables):
        self.cfg, self.layout, self.executables = cfg, layout, executables
        self.weights = layout.put_tree(weights) if layout.mesh is not None else weights
        self.encoded: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
        self.images_encoded = 0  # images (tiles) through the tower (the tests count them)
        self.tower_calls = 0
        self.bidirectional = bidirectional(cfg)  # steps carry each image token's image end (Gemma 3)
        self.whole_prompt = whole_prompt(cfg)  # a prompt is one bidirectional prefix (PaliGemma): prompt ends instead
        self.tiled = tiled(cfg)  # a request's same-size tiles go through together (Idefics3, InternVL)
        # LLaVA-NeXT's and OneVision's images: tiles through together, laid out with this row after each grid row
        self.newline = np.asarray(to_host(weights.newline), np.float32) if anyres(cfg) else None
        self.rows = StepRows(cfg.text_hidden_size, layout, self.encode, self.bidirectional, deepstack_layers(cfg),
                             self.whole_prompt)

    def program(self, pixels: np.ndarray | None = None) -> Program:
        """The tower's program over one image (zeros: what warm-up compiles); a Qwen-VL or Pixtral image's patches
        padded to a bucket of merged blocks, a Gemma 4 image's to a bucket of pooled rows (models/tower_patches)."""
        pixels = blank_pixels(self.cfg) if pixels is None else pixels
        if isinstance(self.cfg, Gemma4VisionConfig):
            tower = self.cfg.vision
            return self.batch_program(gemma4_patches(pixels, tower.patch_size, tower.pool, self.cfg.max_soft_tokens))
        if isinstance(self.cfg, Mistral3Config):
            return self.batch_program(pixtral_patches(pixels, self.cfg.vision.patch_size, self.cfg.merge))
        if not isinstance(self.cfg, Qwen2VLConfig):
            return self.batch_program(pixels[None])
        tower = self.cfg.vision
        window = tower.window if getattr(tower, "windowed", False) else 0
        return self.batch_program(tower_patches(pixels, tower.merge, window, getattr(tower, "grid_side", 0),
                                                getattr(tower, "bicubic", False)))

    def batch_program(self, images: np.ndarray | TowerPatches | MaskedTiles) -> Program:
        """The tower's program over images [B, ...] (Idefics3's, InternVL's: B tiles [C, S, S]; Idefics2's: B tiles
        [C + 1, S, S], their pixel masks last, as MaskedTiles; a Qwen-VL image's padded patches)."""
        if isinstance(self.cfg, Idefics2Config):
            images = masked_tiles(images, self.cfg)
        return Program(step_programs.image_features, [self.weights, self.layout.put_tree(images)],
                       dict(cfg=self.cfg), fixed=1)

    def encode(self, images: list[ImageInput]) -> list[np.ndarray]:
        """Each image's [length, D] float32 rows. Tiles not seen recently go through the tower together (an Idefics3
        or InternVL request's tiles; a LLaVA-NeXT or OneVision request's images' tiles, then laid out by each image's
        `RowLayout` with the newline row after them)."""
        new = list({i.content_hash: i for i in images if i.content_hash not in self.encoded}.values())
        made = {}
        if new and self.tiled:
            rows = self.tile_rows(np.stack([image.pixels for image in new]))
            made = {image.content_hash: rows[k] for k, image in enumerate(new)}
        elif new and self.newline is not None:
            rows, start = self.tile_rows(np.concatenate([image.pixels for image in new])), 0
            for image in new:
                tiles = rows[start : start + len(image.pixels)].reshape(-1, rows.shape[-1])
                made[image.content_hash] = image.layout.rows(np.concatenate([tiles, self.newline[None]]))
                start += len(image.pixels)
        out = [made[i.content_hash] if i.content_hash in made else self.features(i) for i in images]
        for key, rows in made.items():
            self.remember(key, rows)
        return out

    def tile_rows(self, tiles: np.ndarray) -> np.ndarray:
        """Rows [N, R, D] float32 of same-size tiles [N, C, S, S], in tower calls of a power-of-two count up to
        MAX_TILES (zero tiles fill the rest), so a few programs serve any count."""
        out = []
        for start in range(0, len(tiles), MAX_TILES):
            part = tiles[start : start + MAX_TILES]
            pixels = np.zeros((1 << (len(part) - 1).bit_length(), *part.shape[1:]), np.float32)
            pixels[: len(part)] = part
            out.append(np.asarray(to_host(self.executables(self.batch_program(pixels))), np.float32)[: len(part)])
            self.images_encoded, self.tower_calls = self.images_encoded + len(part), self.tower_calls + 1
        return np.concatenate(out)

    def features(self, image: ImageInput) -> np.ndarray:
        """[length, D] float32 rows of one image (encoded now unless recently seen); a Qwen2-VL video's frame groups
        one at a time, each through its size's image program (HF's tower attends within a group only)."""
        rows = self.encoded.get(image.content_hash)
        if rows is None and image.temporal:  # each group's [blocks_h, blocks_w, m*m, F] patches: its blocks' rows
            rows = np.concatenate([self.tower_rows(group)[: group.shape[0] * group.shape[1]] for group in image.pixels])
        elif rows is None:  # a Qwen-VL, Pixtral or Gemma 4 image's padding rows dropped
            rows = self.tower_rows(image.pixels)[: image.length]
        self.remember(image.content_hash, rows)
        return rows

    def tower_rows(self, pixels: np.ndarray) -> np.ndarray:
        """[rows, D] float32 of one image's pixels through the tower, padding rows and all."""
        self.images_encoded, self.tower_calls = self.images_encoded + 1, self.tower_calls + 1
        return np.asarray(to_host(self.executables(self.program(pixels))), np.float32)[0]

    def remember(self, content_hash: str, rows: np.ndarray) -> None:
        """Keep an image's rows as the most recent of the CACHED_IMAGES."""
        self.encoded[content_hash] = rows
        self.encoded.move_to_end(content_hash)
        if len(self.encoded) > CACHED_IMAGES:
            self.encoded.popitem(last=False)

    def prompt_rows(self, length: int, images: tuple[ImageInput, ...] = ()
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """([length, D] float32 rows, [length] bool mask) of a prompt's images at their placeholders: what an
        all-positions pass (prompt logprobs) reads instead of those tokens' embeddings; and an M-RoPE model's
        [length, 3] rotary offsets of its tokens (None for the others)."""
        rows, mask = np.zeros((length, self.rows.width), np.float32), np.zeros(length, bool)
        for image, made in zip(images, self.encode(list(images))):
            rows[image.offset : image.offset + image.length] = made
            mask[image.offset : image.offset + image.length] = True
        rotary = offsets(images, np.arange(length)) if isinstance(self.cfg, Qwen2VLConfig) else None
        return rows, mask, rotary
