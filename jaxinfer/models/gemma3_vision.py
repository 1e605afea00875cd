"""Gemma 3's images (Gemma3ForConditionalGeneration): the SigLIP tower's last hidden state, 2-D average-pooled
to `mm_tokens_per_image` rows, RMS-normed (Gemma's 1 + weight) and projected to the language model's width.

Each start-of-image mark (`boi`) of a prompt becomes "\\n\\n<boi>" + mm_tokens_per_image image tokens +
"<eoi>\\n\\n" (HF's Gemma3Processor); the image tokens attend to each other both ways (HF's token_type_ids
mask), so the engine gives them their image's end as their last visible key (models/vision_language).
The image rows are not multiplied by the embedding scale (HF scatters them after scaling the text's).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError
from jaxinfer.models.llava import complete_config
from jaxinfer.models.vision_tower import (
    VisionConfig,
    VisionWeights,
    abstract_vision,
    last_hidden_state,
    read_vision_config,
)
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("Gemma3ForConditionalGeneration",)


@dataclasses.dataclass(frozen=True)
class Gemma3VisionConfig:
    """What a Gemma 3 vision-language checkpoint adds to its language model (hashable: a static argument)."""

    vision: VisionConfig
    text_hidden_size: int
    image_token_id: int  # the soft tokens the image's rows replace
    image_seq_length: int  # mm_tokens_per_image
    boi_token_id: int  # the mark a prompt puts where an image goes
    eoi_token_id: int

    @property
    def pool(self) -> int:
        """Patches per side averaged into one row per side."""
        return int(math.isqrt(self.vision.num_patches)) // int(math.isqrt(self.image_seq_length))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Gemma3Projector:
    """mm_soft_emb_norm [V] (stored as weight - 1, Gemma's) and mm_input_projection [V, D]."""

    norm: jax.Array
    projection: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Gemma3VisionWeights:
    """The tower and projector (the language model's weights are Gemma 3 text's `Weights`)."""

    tower: VisionWeights
    projector: Gemma3Projector


def abstract_gemma3_vision(cfg: Gemma3VisionConfig) -> Gemma3VisionWeights:
    """Every tower and projector leaf as an ArrayInfo."""
    v = cfg.vision.hidden_size
    projector = Gemma3Projector(ArrayInfo((v,), (None,), init_value=0.0),
                                ArrayInfo((v, cfg.text_hidden_size), (None, None)))
    return Gemma3VisionWeights(abstract_vision(cfg.vision), projector)


def average_pool(x: jax.Array, side: int, pool: int) -> jax.Array:
    """Rows [N, side * side, V] of a row-major patch grid -> [N, (side // pool) ** 2, V], each pool x pool
    square averaged (torch's AvgPool2d with stride = kernel)."""
    n, _, v = x.shape
    out = side // pool
    grid = x.reshape(n, out, pool, out, pool, v)
    return grid.mean(axis=(2, 4)).reshape(n, out * out, v)


def project(p: Gemma3Projector, x: jax.Array, eps: float) -> jax.Array:
    """Gemma's RMSNorm (float32, times 1 + weight), then the projection."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    normed = (normed * (1.0 + p.norm.astype(jnp.float32))).astype(x.dtype)
    return normed @ p.projection


def image_features(weights: Gemma3VisionWeights, pixels: jax.Array, cfg: Gemma3VisionConfig) -> jax.Array:
    """Language-model embeddings [N, image_seq_length, D] of images [N, C, H, W]."""
    states = last_hidden_state(weights.tower, pixels, cfg.vision)
    side = cfg.vision.image_size // cfg.vision.patch_size
    return project(weights.projector, average_pool(states, side, cfg.pool), cfg.vision.eps)


def read_gemma3_vision_config(hf: Mapping[str, Any]) -> Gemma3VisionConfig:
    """A Gemma3VisionConfig from an HF Gemma3ForConditionalGeneration config; ConfigError naming a field it
    cannot run."""
    full = complete_config(hf)
    vision = read_vision_config(full["vision_config"])
    tokens = full.get("mm_tokens_per_image", 256)
    side, per_side = vision.image_size // vision.patch_size, math.isqrt(tokens)
    if per_side * per_side != tokens or per_side == 0 or side % per_side:
        raise ConfigError(f"mm_tokens_per_image {tokens} is not a square whose side divides the tower's "
                          f"{side} x {side} patches")
    return Gemma3VisionConfig(
        vision=vision, text_hidden_size=full["text_config"]["hidden_size"],
        image_token_id=full.get("image_token_index", full.get("image_token_id")), image_seq_length=tokens,
        boi_token_id=full.get("boi_token_index"), eoi_token_id=full.get("eoi_token_index"),
    )
