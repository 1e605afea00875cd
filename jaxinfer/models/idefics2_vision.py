"""Idefics2 images (Idefics2ForConditionalGeneration): a SigLIP tower over tiles of many sizes, a gated MLP to the
language model's width (`modality_projection`) and a Perceiver resampler to `resampler_n_latents` rows per tile
(models/perceiver_resampler). The language model is a Mistral.

The image processor (Idefics2ImageProcessor) resizes each tile within its `shortest_edge` / `longest_edge` and
zero-pads a call's tiles to their largest size, with a pixel mask; with `do_image_splitting` an image is its four
quarters and then itself. Here every tile is padded to the tower's `image_size` square (one program whatever the
sizes), its pixel mask carried as one more channel (`with_mask`: an `ImageInput` holds one array, and its hash
covers both). On the host (`masked_tiles`) a patch is the tile's when all its pixels are, and takes HF's position
id: its row and column as fractions of the tile's patch rows and columns (float32, as HF computes them), bucketed
into the tower's learned side x side grid. Padding patches take position 0 and are keys of no patch, nor of the
resampler, so the rows are the unpadded tile's. HF's bucket boundaries come from torch.arange, which rounds some
of them an ulp apart from k / side by the CPU's vector width; here they are k / side rounded once (HF's on CPU for
idefics2-8b's 70-patch side and every power-of-two side).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import numpy as np

from jaxinfer.config.model import SUPPORTED_ACTIVATIONS, ConfigError
from jaxinfer.models.idefics3_vision import read_idefics_tower
from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.perceiver_resampler import PerceiverConfig, PerceiverWeights, abstract_perceiver, resample
from jaxinfer.models.vision_tower import (
    VisionConfig,
    VisionWeights,
    abstract_vision,
    last_hidden_state,
)
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("Idefics2ForConditionalGeneration",)


@dataclasses.dataclass(frozen=True)
class Idefics2Config:
    """What an Idefics2 checkpoint adds to its language model (hashable: a static program argument)."""

    vision: VisionConfig
    perceiver: PerceiverConfig
    text_hidden_size: int
    projection_size: int  # the modality projection's inner width: text_config.intermediate_size
    projection_activation: str  # text_config.hidden_act, as models/mlp names it
    image_token_id: int  # <image>: one per row of a tile

    @property
    def image_seq_len(self) -> int:
        """Rows (and `<image>` tokens) per tile: the resampler's latents."""
        return self.perceiver.latents


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Idefics2Connector:
    """modality_projection's gated MLP [E -> F -> D], then the resampler."""

    w_gate: jax.Array  # [E, F]
    w_up: jax.Array  # [E, F]
    w_down: jax.Array  # [F, D]
    perceiver: PerceiverWeights


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Idefics2Weights:
    """The SigLIP tower and the connector."""

    tower: VisionWeights
    projector: Idefics2Connector


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MaskedTiles:
    """Tiles padded to the tower's size, each patch's position id and whether it is the tile's."""

    pixels: np.ndarray  # [N, C, S, S] float32
    positions: np.ndarray  # [N, P] int32 rows of the learned position table
    valid: np.ndarray  # [N, P] bool


def abstract_idefics2(cfg: Idefics2Config) -> Idefics2Weights:
    """Every tower and connector leaf as an ArrayInfo."""
    E, F, D = cfg.vision.hidden_size, cfg.projection_size, cfg.text_hidden_size
    mat = lambda a, b: ArrayInfo((a, b), (None, None))  # noqa: E731
    connector = Idefics2Connector(mat(E, F), mat(E, F), mat(F, D), abstract_perceiver(cfg.perceiver))
    return Idefics2Weights(abstract_vision(cfg.vision), connector)


def image_features(weights: Idefics2Weights, tiles: MaskedTiles, cfg: Idefics2Config) -> jax.Array:
    """Language-model rows [N, latents, D] of masked tiles."""
    states = last_hidden_state(weights.tower, tiles.pixels, cfg.vision, tiles.positions, tiles.valid)
    c = weights.projector
    context = gated_mlp(states, c.w_gate, c.w_up, c.w_down, cfg.projection_activation)
    return resample(c.perceiver, context, tiles.valid, cfg.perceiver)


def with_mask(pixels: np.ndarray, mask: np.ndarray, side: int) -> np.ndarray:
    """[C + 1, side, side] float32: a tile's pixels [C, H, W] zero-padded to side x side, then its pixel mask."""
    channels, height, width = pixels.shape
    out = np.zeros((channels + 1, side, side), np.float32)
    out[:channels, :height, :width] = pixels
    out[channels, :height, :width] = mask
    return out


def bucket_ids(count: int, length: int, side: int) -> np.ndarray:
    """[length] the learned-grid row (or column) of each of `length` patches of which the first `count` are the
    tile's: index / count in float32, clamped below 1, bucketed at k / side (HF's torch.bucketize, right)."""
    step = 1.0 / side
    boundaries = (step + np.arange(math.ceil((1.0 - step) / step)) * step).astype(np.float32)
    fractions = np.arange(length, dtype=np.float32) * (np.float32(1) / np.float32(max(count, 1)))
    return np.searchsorted(boundaries, np.minimum(fractions, np.float32(1.0 - 1e-6)), side="right")


def masked_tiles(tiles: np.ndarray, cfg: Idefics2Config) -> MaskedTiles:
    """The tower's input of tiles [N, C + 1, S, S] (`with_mask`'s; an all-zero tile is padding, no patch its own)."""
    n, _, size, _ = tiles.shape
    patch, side = cfg.vision.patch_size, cfg.vision.image_size // cfg.vision.patch_size
    grid = size // patch
    mask = tiles[:, -1, : grid * patch, : grid * patch].reshape(n, grid, patch, grid, patch)
    valid = mask.min(axis=(2, 4)) > 0  # [N, grid, grid]
    positions = np.zeros((n, grid, grid), np.int32)
    for k in range(n):
        rows, cols = int(valid[k, :, 0].sum()), int(valid[k, 0, :].sum())
        ids = bucket_ids(rows, grid, side)[:, None] * side + bucket_ids(cols, grid, side)[None, :]
        positions[k] = np.where(valid[k], ids, 0)
    return MaskedTiles(np.ascontiguousarray(tiles[:, :-1]), positions.reshape(n, -1), valid.reshape(n, -1))


def read_idefics2_config(hf: Mapping[str, Any]) -> Idefics2Config:
    """An Idefics2Config from an HF Idefics2 config (transformers' defaults where a field is left out);
    ConfigError naming a field it cannot run."""
    from jaxinfer.models.llava import complete_config

    full = complete_config({**hf, "model_type": hf.get("model_type", "idefics2")})
    vision, text, perceiver = full["vision_config"], full["text_config"], full["perceiver_config"]
    tower = read_idefics_tower(vision)
    for field, name in (("text_config.hidden_act", text.get("hidden_act", "silu")),
                        ("perceiver_config.hidden_act", perceiver.get("hidden_act", "silu"))):
        if name not in SUPPORTED_ACTIVATIONS:
            raise ConfigError(f"{field} {name!r} is not supported; supported: {', '.join(SUPPORTED_ACTIVATIONS)}")
    resampler = PerceiverConfig(
        hidden_size=int(perceiver["hidden_size"]), latents=int(perceiver["resampler_n_latents"]),
        depth=int(perceiver["resampler_depth"]), heads=int(perceiver["resampler_n_heads"]),
        kv_heads=int(perceiver["num_key_value_heads"]), head_dim=int(perceiver["resampler_head_dim"]),
        eps=float(perceiver["rms_norm_eps"]), activation=SUPPORTED_ACTIVATIONS[perceiver.get("hidden_act", "silu")],
    )
    if resampler.hidden_size != int(text["hidden_size"]) or resampler.heads % resampler.kv_heads:
        raise ConfigError(f"perceiver_config.hidden_size {resampler.hidden_size} must be text_config.hidden_size "
                          f"{text['hidden_size']} and resampler_n_heads {resampler.heads} a multiple of "
                          f"num_key_value_heads {resampler.kv_heads}")
    return Idefics2Config(vision=tower, perceiver=resampler, text_hidden_size=int(text["hidden_size"]),
                          projection_size=int(text["intermediate_size"]),
                          projection_activation=SUPPORTED_ACTIVATIONS[text.get("hidden_act", "silu")],
                          image_token_id=int(full["image_token_id"]))
