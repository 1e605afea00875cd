"""Aya Vision images (AyaVisionForConditionalGeneration, CohereLabs/aya-vision-8b and -32b): a SigLIP tower's
`vision_feature_layer` rows (LLaVA's choice of layers and strategy: models/llava), pixel-shuffled by
`downsample_factor` (models/pixel_shuffle: HF's AyaVisionMultiModalProjector reshapes in Idefics3's order), then a
LayerNorm and a SwiGLU projector: linear_1 to `alignment_intermediate_size`, its second half through SiLU gating
the first, linear_2 to the language model's width. The language model is Cohere2 (its `text_config`).

Its image processor (GotOcr2ImageProcessor, `crop_to_patches` on as AyaVisionProcessor passes it) cuts each image
into tiles of the tower's size plus a thumbnail, as InternVL's does; entrypoints/aya_vision_prompts lays the prompt
out. Cohere2 Vision (models/cohere2_vision) reads its rows from the tower's output and has no LayerNorm: the same
projector with `norm_eps` None and `feature_layers` None.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError
from jaxinfer.models.llava import feature_depth, feature_rows, read_feature_layers
from jaxinfer.models.pixel_shuffle import pixel_shuffle
from jaxinfer.models.vision_tower import (
    VisionConfig,
    VisionWeights,
    abstract_vision,
    hidden_states,
    last_hidden_state,
    layer_norm,
    read_vision_config,
)
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("AyaVisionForConditionalGeneration",)
STRATEGIES = ("default", "full")


@dataclasses.dataclass(frozen=True)
class AyaVisionConfig:
    """What an Aya Vision (or Cohere2 Vision) checkpoint adds to its language model (hashable: a static program
    argument)."""

    vision: VisionConfig
    feature_layers: tuple[int, ...] | None  # hidden_states indices concatenated; None: the tower's output
    full: bool  # keep the first row ("full" strategy)
    scale: int  # downsample_factor: the pixel shuffle's block side, in patches
    norm_eps: float | None  # the projector's LayerNorm (adapter_layer_norm_eps); None: no norm (Cohere2 Vision)
    intermediate_size: int  # alignment_intermediate_size: linear_1's width, gate and value halves
    text_hidden_size: int
    image_token_id: int  # one per row of a tile

    @property
    def rows_per_layer(self) -> int:
        """Rows a tile's chosen layers give before the shuffle."""
        return self.vision.num_positions - (0 if self.full or self.feature_layers is None else 1)

    @property
    def features_width(self) -> int:
        """Width of a tile's rows before the shuffle (the chosen layers side by side)."""
        return self.vision.hidden_size * (1 if self.feature_layers is None else len(self.feature_layers))

    @property
    def image_seq_len(self) -> int:
        """Rows (and placeholder tokens) per tile: its patches over scale squared."""
        return self.vision.num_patches // self.scale ** 2


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SwigluProjector:
    """LayerNorm [F] (None without one), linear_1 [F, I] with bias, linear_2 [I / 2, D] with bias; F is the
    shuffled width."""

    norm: jax.Array | None
    norm_bias: jax.Array | None
    w1: jax.Array
    b1: jax.Array
    w2: jax.Array
    b2: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class AyaVisionWeights:
    """The SigLIP tower and the projector."""

    tower: VisionWeights
    projector: SwigluProjector


def abstract_aya_vision(cfg: AyaVisionConfig) -> AyaVisionWeights:
    """Every tower and projector leaf as an ArrayInfo."""
    F, I, D = cfg.features_width * cfg.scale ** 2, cfg.intermediate_size, cfg.text_hidden_size
    vec = lambda n, value=0.0: ArrayInfo((n,), (None,), init_value=value)  # noqa: E731
    norm = cfg.norm_eps is not None
    projector = SwigluProjector(vec(F, 1.0) if norm else None, vec(F) if norm else None,
                                ArrayInfo((F, I), (None, None)), vec(I), ArrayInfo((I // 2, D), (None, None)), vec(D))
    return AyaVisionWeights(abstract_vision(cfg.vision), projector)


def swiglu_project(p: SwigluProjector, x: jax.Array, norm_eps: float | None) -> jax.Array:
    """linear_2(silu(gate) * value) where value, gate = linear_1(LayerNorm(x)) halves (HF's `chunk(2)` order)."""
    x = x if p.norm is None else layer_norm(x, p.norm, p.norm_bias, norm_eps)
    value, gate = jnp.split(x @ p.w1 + p.b1, 2, axis=-1)
    return (jax.nn.silu(gate) * value) @ p.w2 + p.b2


def image_features(weights: AyaVisionWeights, pixels: jax.Array, cfg: AyaVisionConfig) -> jax.Array:
    """Language-model rows [N, image_seq_len, D] of tiles [N, C, S, S]."""
    v = cfg.vision
    if cfg.feature_layers is None:
        rows = last_hidden_state(weights.tower, pixels, v)
    else:
        states = hidden_states(weights.tower, pixels, v, feature_depth(v.num_layers, cfg.feature_layers))
        rows = feature_rows(states, v.num_layers, cfg.feature_layers, cfg.full)
    return swiglu_project(weights.projector, pixel_shuffle(rows, cfg.scale), cfg.norm_eps)


def checked(cfg: AyaVisionConfig) -> AyaVisionConfig:
    """cfg, or ConfigError naming the field whose rows do not make a square grid the shuffle divides."""
    v, side = cfg.vision, cfg.vision.image_size // cfg.vision.patch_size
    if cfg.rows_per_layer != v.num_patches:
        raise ConfigError(f"vision_feature_select_strategy {'full' if cfg.full else 'default'!r} is not supported "
                          f"with this tower: it leaves {cfg.rows_per_layer} rows a tile, not the square grid of "
                          f"{v.num_patches} patches the pixel shuffle takes (supported: 'full' with SigLIP)")
    if cfg.scale < 1 or side % cfg.scale:
        raise ConfigError(f"downsample_factor {cfg.scale} is not supported; supported: a divisor of the tower's "
                          f"{side} patches a side (image_size {v.image_size} over patch_size {v.patch_size})")
    if cfg.intermediate_size % 2:
        raise ConfigError(f"alignment_intermediate_size {cfg.intermediate_size} is not supported; supported: an "
                          "even size (its halves are SwiGLU's value and gate)")
    return cfg


def read_aya_vision_config(hf: Mapping[str, Any]) -> AyaVisionConfig:
    """An AyaVisionConfig from an HF Aya Vision config (transformers' defaults where a field is left out);
    ConfigError naming a field it cannot run."""
    from jaxinfer.models.llava import complete_config

    full = complete_config({**hf, "model_type": hf.get("model_type", "aya_vision")})
    vision, text = read_vision_config(full["vision_config"]), full["text_config"]
    strategy = full.get("vision_feature_select_strategy", "full")
    if strategy not in STRATEGIES:
        raise ConfigError(f"vision_feature_select_strategy {strategy!r} is not supported; supported: {STRATEGIES}")
    return checked(AyaVisionConfig(
        vision=vision, feature_layers=read_feature_layers(full.get("vision_feature_layer", -1), vision.num_layers),
        full=strategy == "full", scale=int(full.get("downsample_factor", 2)),
        norm_eps=float(full.get("adapter_layer_norm_eps", 1e-6)),
        intermediate_size=int(full.get("alignment_intermediate_size", text["hidden_size"])),
        text_hidden_size=int(text["hidden_size"]),
        image_token_id=int(full.get("image_token_index", full.get("image_token_id"))),
    ))
