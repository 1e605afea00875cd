"""PaliGemma's and PaliGemma 2's images (PaliGemmaForConditionalGeneration): the SigLIP tower's last hidden state,
one row per patch, through one linear projector (with bias) to the language model's width.

transformers 5 scatters the projected rows into the embeddings after Gemma's sqrt(hidden) scale (its scaled word
embedding), so they are used as projected (older releases divided by sqrt(hidden) before a model-wide scale: the
same rows). The language model is Gemma (PaliGemma) or Gemma 2 (PaliGemma 2), read from `text_config`; the whole
prompt (image tokens, bos, text, "\\n") is one bidirectional prefix (HF's token_type_ids 0), which the engine runs
as every prompt token's key end at the prompt's end (`whole_prompt` in models/vision_language).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax

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

ARCHITECTURES = ("PaliGemmaForConditionalGeneration",)


@dataclasses.dataclass(frozen=True)
class PaliGemmaConfig:
    """What a PaliGemma checkpoint adds to its language model (hashable: a static argument)."""

    vision: VisionConfig
    text_hidden_size: int
    image_token_id: int  # the placeholders the image's rows replace (`<image>`)
    image_seq_length: int  # one row per patch


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PaliGemmaProjector:
    """multi_modal_projector.linear: weight [V, D] (stored [D, V]), bias [D]."""

    weight: jax.Array
    bias: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PaliGemmaWeights:
    """The tower and projector (the language model's weights are Gemma's or Gemma 2's `Weights`)."""

    tower: VisionWeights
    projector: PaliGemmaProjector


def abstract_paligemma(cfg: PaliGemmaConfig) -> PaliGemmaWeights:
    """Every tower and projector leaf as an ArrayInfo."""
    v, d = cfg.vision.hidden_size, cfg.text_hidden_size
    projector = PaliGemmaProjector(ArrayInfo((v, d), (None, None)), ArrayInfo((d,), (None,), init_value=0.0))
    return PaliGemmaWeights(abstract_vision(cfg.vision), projector)


def image_features(weights: PaliGemmaWeights, pixels: jax.Array, cfg: PaliGemmaConfig) -> jax.Array:
    """Language-model embeddings [N, patches, D] of images [N, C, H, W]."""
    states = last_hidden_state(weights.tower, pixels, cfg.vision)
    return states @ weights.projector.weight + weights.projector.bias


def read_paligemma_config(hf: Mapping[str, Any]) -> PaliGemmaConfig:
    """A PaliGemmaConfig from an HF PaliGemmaForConditionalGeneration config; ConfigError naming a field it cannot
    run."""
    full = complete_config(hf)
    vision = read_vision_config(full["vision_config"])
    if vision.class_token:
        raise ConfigError(f"vision_config.model_type {full['vision_config']['model_type']!r} is not supported for "
                          "PaliGemma; accepted: siglip_vision_model")
    text_hidden = full["text_config"]["hidden_size"]
    if full.get("projection_dim", text_hidden) != text_hidden:
        raise ConfigError(f"projection_dim {full['projection_dim']} differs from text_config.hidden_size "
                          f"{text_hidden}; PaliGemma projects the image rows to the language model's width")
    return PaliGemmaConfig(vision=vision, text_hidden_size=text_hidden,
                           image_token_id=full.get("image_token_id", full.get("image_token_index")),
                           image_seq_length=vision.num_patches)
