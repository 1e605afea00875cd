"""Idefics3 and SmolVLM images (Idefics3ForConditionalGeneration, SmolVLMForConditionalGeneration): a SigLIP tower's
last hidden state, pixel-shuffled (each scale x scale block of patches concatenated into one row: space to depth)
and projected to the language model's width by one linear without bias (`modality_projection`).

The image processor cuts a large image into tiles of `max_image_size` pixels plus the whole image resized to one
tile, every tile square at the tower's `image_size` (no patch padding, so HF's `patch_attention_mask` is all
ones and its bucketed position ids are the plain 0..P-1 that `vision_tower` adds). Each tile has its own run of
`image_seq_len` `<image>` tokens in the prompt; the marks around them (`<fake_token_around_image>`,
`<row_r_col_c>`, `<global-img>`, newlines) are text. The language model is a Llama (SmolLM for SmolVLM).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax

from jaxinfer.config.model import ConfigError
from jaxinfer.models.pixel_shuffle import pixel_shuffle
from jaxinfer.models.vision_tower import (
    VISION_ACTIVATIONS,
    VisionConfig,
    VisionWeights,
    abstract_vision,
    last_hidden_state,
)
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration")
VISION_TYPES = ("idefics3_vision", "smolvlm_vision")


@dataclasses.dataclass(frozen=True)
class Idefics3VisionConfig:
    """What an Idefics3 / SmolVLM checkpoint adds to its language model (hashable: a static program argument)."""

    vision: VisionConfig
    scale: int  # scale_factor: the pixel shuffle's block side, in patches
    text_hidden_size: int
    image_token_id: int  # <image>: one per row of a tile

    @property
    def image_seq_len(self) -> int:
        """Rows (and `<image>` tokens) per tile: its patches over scale squared."""
        return self.vision.num_patches // self.scale ** 2


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Idefics3Projector:
    """modality_projection [E * scale^2, D] (a Linear without bias)."""

    projection: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Idefics3Weights:
    """The SigLIP tower and the connector's projection."""

    tower: VisionWeights
    projector: Idefics3Projector


def abstract_idefics3(cfg: Idefics3VisionConfig) -> Idefics3Weights:
    """Every tower and connector leaf as an ArrayInfo."""
    rows = cfg.vision.hidden_size * cfg.scale ** 2
    return Idefics3Weights(abstract_vision(cfg.vision),
                           Idefics3Projector(ArrayInfo((rows, cfg.text_hidden_size), (None, None))))


def image_features(weights: Idefics3Weights, pixels: jax.Array, cfg: Idefics3VisionConfig) -> jax.Array:
    """Language-model rows [N, image_seq_len, D] of tiles [N, C, S, S]."""
    states = last_hidden_state(weights.tower, pixels, cfg.vision)
    return pixel_shuffle(states, cfg.scale) @ weights.projector.projection


def read_idefics_tower(vision: Mapping[str, Any]) -> VisionConfig:
    """The SigLIP tower of an Idefics2 / Idefics3 / SmolVLM `vision_config` (no class token; transformers'
    defaults where a field is left out); ConfigError naming an activation it cannot run."""
    act = vision.get("hidden_act", "gelu_pytorch_tanh")
    if act not in VISION_ACTIVATIONS:
        raise ConfigError(f"vision_config.hidden_act {act!r} is not supported; supported: {VISION_ACTIVATIONS}")
    return VisionConfig(
        hidden_size=int(vision["hidden_size"]), intermediate_size=int(vision["intermediate_size"]),
        num_layers=int(vision["num_hidden_layers"]), num_heads=int(vision["num_attention_heads"]),
        image_size=int(vision["image_size"]), patch_size=int(vision["patch_size"]),
        num_channels=int(vision.get("num_channels", 3)), eps=float(vision.get("layer_norm_eps", 1e-6)),
        activation=act, class_token=False,
    )


def read_idefics3_config(hf: Mapping[str, Any]) -> Idefics3VisionConfig:
    """An Idefics3VisionConfig from an HF Idefics3 / SmolVLM config (transformers' defaults where a field is left
    out); ConfigError naming a field it cannot run."""
    from jaxinfer.models.llava import complete_config

    full = complete_config({**hf, "model_type": hf.get("model_type", "idefics3")})
    vision, text = full["vision_config"], full["text_config"]
    if vision.get("model_type") not in VISION_TYPES:
        raise ConfigError(f"vision_config.model_type {vision.get('model_type')!r} is not supported; supported: "
                          f"{VISION_TYPES}")
    tower = read_idefics_tower(vision)
    scale, side = int(full.get("scale_factor", 2)), tower.image_size // tower.patch_size
    if scale < 1 or side % scale:
        raise ConfigError(f"scale_factor {scale} must divide the tower's {side} patches a side (image_size "
                          f"{tower.image_size} over patch_size {tower.patch_size})")
    return Idefics3VisionConfig(vision=tower, scale=scale, text_hidden_size=int(text["hidden_size"]),
                                image_token_id=int(full["image_token_id"]))
