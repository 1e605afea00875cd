"""The vision-language architectures by name: LLaVA's (models/llava) and Gemma 3's (models/gemma3_vision).

Each runs its language model as the text family its `text_config` names; this module picks what the images
add (config, weight tree, features program) by the checkpoint's architecture or its config's type.
"""

from __future__ import annotations

from typing import Any, Mapping, Union

import jax

import jaxinfer.models.gemma3_vision as gemma3_vision
import jaxinfer.models.llava as llava
from jaxinfer.models.gemma3_vision import Gemma3VisionConfig, Gemma3VisionWeights
from jaxinfer.models.llava import LlavaConfig, LlavaWeights

ARCHITECTURES = llava.ARCHITECTURES + gemma3_vision.ARCHITECTURES
VisionLanguageConfig = Union[LlavaConfig, Gemma3VisionConfig]
VisionLanguageWeights = Union[LlavaWeights, Gemma3VisionWeights]


def read_vision_language_config(hf: Mapping[str, Any]) -> VisionLanguageConfig:
    """The image side of a vision-language checkpoint's config (by its architecture)."""
    if hf["architectures"][0] in gemma3_vision.ARCHITECTURES:
        return gemma3_vision.read_gemma3_vision_config(hf)
    return llava.read_llava_config(hf)


def abstract_vision_language(cfg: VisionLanguageConfig) -> Any:
    """The tower and projector leaves as ArrayInfos."""
    if isinstance(cfg, Gemma3VisionConfig):
        return gemma3_vision.abstract_gemma3_vision(cfg)
    return llava.abstract_llava(cfg)


def image_features(weights: VisionLanguageWeights, pixels: jax.Array, cfg: VisionLanguageConfig) -> jax.Array:
    """Language-model embeddings [N, image_seq_length, D] of images [N, C, H, W]."""
    if isinstance(cfg, Gemma3VisionConfig):
        return gemma3_vision.image_features(weights, pixels, cfg)
    return llava.image_features(weights, pixels, cfg)


def mark_token_id(cfg: VisionLanguageConfig) -> int:
    """The token a prompt marks each image with (LLaVA's image token; Gemma 3's start of image)."""
    return cfg.boi_token_id if isinstance(cfg, Gemma3VisionConfig) else cfg.image_token_id


def bidirectional(cfg: VisionLanguageConfig | None) -> bool:
    """Whether an image's tokens attend to each other both ways (a prefill chunk must hold a whole image)."""
    return isinstance(cfg, Gemma3VisionConfig)
