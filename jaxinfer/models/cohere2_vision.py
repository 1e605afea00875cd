"""Cohere2 Vision images (Cohere2VisionForConditionalGeneration, CohereLabs/command-a-vision-07-2025): Aya Vision's
path (models/aya_vision) with the SigLIP tower's output (its last hidden state after the post-norm) as the rows and
no LayerNorm before the SwiGLU projector. The language model is Cohere2.

Its image processor (Cohere2VisionImageProcessor) cuts each image into tiles of the tower's size on the grid of at
most `max_patches` tiles that needs the least upscaling (or, when every grid shrinks the image, the least
shrinking), plus a thumbnail last when there is more than one tile: entrypoints/cohere2_vision_tiles.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxinfer.models.aya_vision import AyaVisionConfig, checked
from jaxinfer.models.vision_tower import read_vision_config

ARCHITECTURES = ("Cohere2VisionForConditionalGeneration",)


@dataclasses.dataclass(frozen=True)
class Cohere2VisionConfig(AyaVisionConfig):
    """Aya Vision's config read from a Cohere2 Vision checkpoint (its prompts and tiles are its own)."""


def read_cohere2_vision_config(hf: Mapping[str, Any]) -> Cohere2VisionConfig:
    """A Cohere2VisionConfig from an HF Cohere2 Vision config (transformers' defaults where a field is left out);
    ConfigError naming a field it cannot run."""
    from jaxinfer.models.llava import complete_config

    full = complete_config({**hf, "model_type": hf.get("model_type", "cohere2_vision")})
    vision, text = read_vision_config(full["vision_config"]), full["text_config"]
    return checked(Cohere2VisionConfig(
        vision=vision, feature_layers=None, full=True, scale=int(full.get("downsample_factor", 2)), norm_eps=None,
        intermediate_size=int(full.get("alignment_intermediate_size", 36864)),
        text_hidden_size=int(text["hidden_size"]), image_token_id=int(full["image_token_id"]),
    ))
