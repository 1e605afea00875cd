"""InternVL 3 / 3.5 images (InternVLForConditionalGeneration, the HF-native OpenGVLab/InternVL3-*-hf checkpoints): an
InternViT tower's patch states at `vision_feature_layer` (the class token dropped), pixel-shuffled by
1 / `downsample_ratio` (models/pixel_shuffle, Idefics3's order) and projected to the language model's width by
LayerNorm -> Linear -> GELU -> Linear.

The image processor (GotOcr2ImageProcessor, `crop_to_patches`) cuts an image into up to `max_patches` tiles of the
tower's `image_size`, the grid chosen by aspect ratio, plus a thumbnail of the whole image when there is more than
one tile. The prompt holds `<img>`, `image_seq_length` `<IMG_CONTEXT>` rows per tile (thumbnail last), `</img>`.
The language model is the text family its `text_config` names (Qwen2 / Qwen2.5, Qwen3 in InternVL 3.5, Llama).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax

from jaxinfer.config.model import ConfigError
from jaxinfer.models.internvit import NORM_TYPES, InternViTConfig, InternViTWeights, abstract_internvit, hidden_states
from jaxinfer.models.internvit import last_hidden_state as tower_output
from jaxinfer.models.pixel_shuffle import pixel_shuffle
from jaxinfer.models.vision_tower import VISION_ACTIVATIONS, layer_norm, vision_activation
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("InternVLForConditionalGeneration",)
PROJECTOR_EPS = 1e-5  # the projector's LayerNorm is built with torch's default eps


@dataclasses.dataclass(frozen=True)
class InternVLVisionConfig:
    """What an InternVL checkpoint adds to its language model (hashable: a static program argument)."""

    vision: InternViTConfig
    scale: int  # 1 / downsample_ratio: the pixel shuffle's block side, in patches
    feature_layer: int  # vision_feature_layer: -1 the tower's output, else HF's hidden_states index
    text_hidden_size: int
    image_token_id: int  # <IMG_CONTEXT>: one per row of a tile
    projector_activation: str = "gelu"

    @property
    def image_seq_len(self) -> int:
        """Rows (and `<IMG_CONTEXT>` tokens) per tile: its patches over scale squared."""
        return self.vision.num_patches // self.scale ** 2


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class InternVLProjector:
    """multi_modal_projector: LayerNorm [E * scale^2], linear_1 [E * scale^2, D], linear_2 [D, D], with biases."""

    norm: jax.Array
    norm_bias: jax.Array
    w1: jax.Array
    b1: jax.Array
    w2: jax.Array
    b2: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class InternVLWeights:
    """The InternViT tower and the projector."""

    tower: InternViTWeights
    projector: InternVLProjector


def abstract_internvl(cfg: InternVLVisionConfig) -> InternVLWeights:
    """Every tower and projector leaf as an ArrayInfo."""
    E, D = cfg.vision.hidden_size * cfg.scale ** 2, cfg.text_hidden_size
    vec = lambda n, value=0.0: ArrayInfo((n,), (None,), init_value=value)  # noqa: E731
    projector = InternVLProjector(vec(E, 1.0), vec(E), ArrayInfo((E, D), (None, None)), vec(D),
                                  ArrayInfo((D, D), (None, None)), vec(D))
    return InternVLWeights(abstract_internvit(cfg.vision), projector)


def patch_states(weights: InternViTWeights, pixels: jax.Array, cfg: InternVLVisionConfig) -> jax.Array:
    """The tower's states [N, P, E] at vision_feature_layer, the class token dropped."""
    v = cfg.vision
    if cfg.feature_layer == -1:
        states = tower_output(weights, pixels, v)
    else:
        index = cfg.feature_layer % (v.num_layers + 1)
        states = hidden_states(weights, pixels, v, index)[index]
    return states[:, 1:]


def image_features(weights: InternVLWeights, pixels: jax.Array, cfg: InternVLVisionConfig) -> jax.Array:
    """Language-model rows [N, image_seq_len, D] of tiles [N, C, S, S]."""
    p = weights.projector
    x = pixel_shuffle(patch_states(weights.tower, pixels, cfg), cfg.scale)
    x = vision_activation(cfg.projector_activation, layer_norm(x, p.norm, p.norm_bias, PROJECTOR_EPS) @ p.w1 + p.b1)
    return x @ p.w2 + p.b2


def _square(value: Any, field: str) -> int:
    """One side of a square size given as an int or [h, w]; ConfigError for a non-square one."""
    sides = list(value) if isinstance(value, (list, tuple)) else [value, value]
    if len(sides) != 2 or sides[0] != sides[1]:
        raise ConfigError(f"vision_config.{field} {value!r} is not supported; supported: a square size")
    return int(sides[0])


def read_tower_config(vision: Mapping[str, Any]) -> InternViTConfig:
    """An InternViTConfig from a completed HF InternVLVisionConfig; ConfigError naming a field it cannot run."""
    act, norm_type = vision.get("hidden_act", "gelu"), vision.get("norm_type", "layer_norm")
    if vision.get("model_type") != "internvl_vision":
        raise ConfigError(f"vision_config.model_type {vision.get('model_type')!r} is not supported; supported: "
                          "'internvl_vision'")
    if act not in VISION_ACTIVATIONS:
        raise ConfigError(f"vision_config.hidden_act {act!r} is not supported; supported: {VISION_ACTIVATIONS}")
    if norm_type not in NORM_TYPES:
        raise ConfigError(f"vision_config.norm_type {norm_type!r} is not supported; supported: {NORM_TYPES}")
    return InternViTConfig(
        hidden_size=int(vision["hidden_size"]), intermediate_size=int(vision["intermediate_size"]),
        num_layers=int(vision["num_hidden_layers"]), num_heads=int(vision["num_attention_heads"]),
        image_size=_square(vision["image_size"], "image_size"), patch_size=_square(vision["patch_size"], "patch_size"),
        num_channels=int(vision.get("num_channels", 3)), eps=float(vision.get("layer_norm_eps", 1e-6)),
        activation=act, norm_type=norm_type, attention_bias=bool(vision.get("attention_bias", False)),
        qk_norm=bool(vision.get("use_qk_norm", False)),
        positions=bool(vision.get("use_absolute_position_embeddings", True)),
        final_norm=not vision.get("use_mean_pooling", True),
    )


def read_internvl_config(hf: Mapping[str, Any]) -> InternVLVisionConfig:
    """An InternVLVisionConfig from an HF InternVL config (transformers' defaults where a field is left out);
    ConfigError naming a field it cannot run."""
    from jaxinfer.models.llava import complete_config

    full = complete_config({**hf, "model_type": hf.get("model_type", "internvl")})
    tower = read_tower_config(full["vision_config"])
    layer, strategy = full.get("vision_feature_layer", -1), full.get("vision_feature_select_strategy", "default")
    if not isinstance(layer, int) or not -tower.num_layers - 1 <= layer <= tower.num_layers:
        raise ConfigError(f"vision_feature_layer {layer!r} is not supported; supported: one layer index in "
                          f"[{-tower.num_layers - 1}, {tower.num_layers}]")
    if strategy != "default":  # 'full' keeps the class token, which no square grid holds (HF cannot run it either)
        raise ConfigError(f"vision_feature_select_strategy {strategy!r} is not supported; supported: 'default'")
    ratio, side = float(full.get("downsample_ratio", 0.5)), tower.image_size // tower.patch_size
    scale = int(round(1 / ratio)) if ratio > 0 else 0
    if scale < 1 or abs(scale * ratio - 1) > 1e-6 or side % scale:
        raise ConfigError(f"downsample_ratio {ratio} is not supported; supported: 1 / n for n dividing the tower's "
                          f"{side} patches a side (image_size {tower.image_size} over patch_size {tower.patch_size})")
    act = full.get("projector_hidden_act", "gelu")
    if act not in VISION_ACTIVATIONS:
        raise ConfigError(f"projector_hidden_act {act!r} is not supported; supported: {VISION_ACTIVATIONS}")
    cfg = InternVLVisionConfig(vision=tower, scale=scale, feature_layer=layer,
                               text_hidden_size=int(full["text_config"]["hidden_size"]),
                               image_token_id=int(full["image_token_id"]), projector_activation=act)
    if int(full.get("image_seq_length", cfg.image_seq_len)) != cfg.image_seq_len:
        raise ConfigError(f"image_seq_length {full['image_seq_length']} does not match the tower's "
                          f"{cfg.image_seq_len} rows a tile ((image_size / patch_size)^2 * downsample_ratio^2)")
    return cfg
