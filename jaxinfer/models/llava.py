"""LLaVA (llava-1.5 style): a vision tower's chosen hidden states, through a 2-layer GELU projector,
stand in for the image placeholder tokens of any text family's prompt. VipLLaVA
(VipLlavaForConditionalGeneration) is the same with a LayerNorm before the projector (`projector_layernorm_eps`)
and its feature layers always read without their first row.

The language model is the text family named by the checkpoint's `text_config` (its ModelConfig
comes from `text_hf_config`); this module holds what the images add: the tower's config and the
choice of its features (`vision_feature_layer`, an int or a list whose layers are concatenated;
`vision_feature_select_strategy` "default" drops the first row, CLIP's class token, "full" keeps
it), the projector, and the placeholder token and count per image.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError
from jaxinfer.models.vision_tower import (
    VisionConfig,
    VisionWeights,
    abstract_vision,
    hidden_states,
    layer_norm,
    read_vision_config,
    vision_activation,
)
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("LlavaForConditionalGeneration", "VipLlavaForConditionalGeneration")
# Language models transformers' causal-LM map leaves out (5.24 lists Mistral4ForCausalLM for pretraining only):
# Mistral Small 4 ships as Mistral3ForConditionalGeneration around one.
CAUSAL_LM_UNMAPPED = {"mistral4": "Mistral4ForCausalLM"}
# transformers' Aya Vision and Cohere2 Vision heads are a bare lm_head: their Cohere2 text's logit_scale is not applied
# (vLLM's Cohere2ForCausalLM applies it; HF is the reference here)
UNSCALED_LOGITS = ("aya_vision", "cohere2_vision")
STRATEGIES = ("default", "full")
PROJECTOR_ACTIVATIONS = ("gelu", "gelu_pytorch_tanh", "gelu_new", "quick_gelu")


@dataclasses.dataclass(frozen=True)
class LlavaConfig:
    """What a LLaVA checkpoint adds to its language model (hashable: a static program argument)."""

    vision: VisionConfig
    feature_layers: tuple[int, ...]  # hidden_states indices (negative from the end), concatenated
    full: bool  # keep CLIP's class token ("full" strategy)
    projector_activation: str
    projector_bias: bool
    text_hidden_size: int
    image_token_id: int
    image_seq_length: int  # placeholder tokens per image
    projector_norm_eps: float | None = None  # VipLLaVA's LayerNorm before linear_1; None: no norm

    @property
    def tokens_per_image(self) -> int:
        """Rows the tower gives each image (the placeholders the prompt needs)."""
        return self.vision.num_positions - (0 if self.full else 1)

    @property
    def depth(self) -> int:
        """Tower layers that must run to reach every feature layer."""
        return feature_depth(self.vision.num_layers, self.feature_layers)


def feature_depth(num_layers: int, layers: tuple[int, ...]) -> int:
    """Tower layers that must run to reach each of `layers` (hidden_states indices, negative from the end)."""
    return max(i % (num_layers + 1) for i in layers)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Projector:
    """linear_1 [F_in, D], act, linear_2 [D, D] (biases None when the checkpoint has none), after VipLLaVA's
    LayerNorm [F_in] (None elsewhere)."""

    w1: jax.Array
    b1: jax.Array | None
    w2: jax.Array
    b2: jax.Array | None
    norm: jax.Array | None = None
    norm_bias: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LlavaWeights:
    """The tower and projector (the language model's weights are the text family's `Weights`)."""

    tower: VisionWeights
    projector: Projector


def abstract_llava(cfg: LlavaConfig) -> LlavaWeights:
    """Every tower and projector leaf as an ArrayInfo."""
    f_in, d = cfg.vision.hidden_size * len(cfg.feature_layers), cfg.text_hidden_size
    bias = lambda: ArrayInfo((d,), (None,), init_value=0.0) if cfg.projector_bias else None  # noqa: E731
    norm = cfg.projector_norm_eps is not None
    projector = Projector(ArrayInfo((f_in, d), (None, None)), bias(), ArrayInfo((d, d), (None, None)), bias(),
                          ArrayInfo((f_in,), (None,), init_value=1.0) if norm else None,
                          ArrayInfo((f_in,), (None,), init_value=0.0) if norm else None)
    return LlavaWeights(abstract_vision(cfg.vision), projector)


def select_features(states: list[jax.Array], cfg: LlavaConfig) -> jax.Array:
    """The feature layers' rows [N, tokens_per_image, F_in] (see `feature_rows`)."""
    return feature_rows(states, cfg.vision.num_layers, cfg.feature_layers, cfg.full)


def feature_rows(states: list[jax.Array], num_layers: int, layers: tuple[int, ...], full: bool) -> jax.Array:
    """`layers`' rows concatenated [N, rows, E * len(layers)], the first (CLIP's class token) dropped unless `full`
    (a SigLIP tower's first patch too, as transformers and vLLM drop it); states: hidden_states[0 .. depth] of a
    tower of num_layers layers (the indices, taken modulo num_layers + 1, fall in it)."""
    chosen = jnp.concatenate([states[i % (num_layers + 1)] for i in layers], axis=-1)
    return chosen if full else chosen[:, 1:]


def project(p: Projector, x: jax.Array, activation: str, norm_eps: float | None = None) -> jax.Array:
    """linear_2(act(linear_1(x))), x LayerNormed first where the projector has a norm (VipLLaVA's)."""
    x = x if p.norm is None else layer_norm(x, p.norm, p.norm_bias, norm_eps)
    h = x @ p.w1 + (0 if p.b1 is None else p.b1)
    return vision_activation(activation, h) @ p.w2 + (0 if p.b2 is None else p.b2)


def image_features(weights: LlavaWeights, pixels: jax.Array, cfg: LlavaConfig) -> jax.Array:
    """Language-model embeddings [N, tokens_per_image, D] of images [N, C, H, W]."""
    states = hidden_states(weights.tower, pixels, cfg.vision, cfg.depth)
    return project(weights.projector, select_features(states, cfg), cfg.projector_activation, cfg.projector_norm_eps)


def complete_config(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint's config with transformers' defaults filled in (hub configs leave most of their
    text_config and vision_config out)."""
    import transformers

    fields = {k: v for k, v in hf.items() if k not in ("model_type", "architectures")}
    model_type = hf.get("model_type", "llava")
    if model_type not in transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES:
        raise ConfigError(f"model_type {model_type!r} is unknown to the installed transformers "
                          f"({transformers.__version__}), whose config class fills in its defaults: install a "
                          "transformers that has it")
    return transformers.AutoConfig.for_model(model_type, **fields).to_dict()


def text_hf_config(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's HF config, as a causal LM checkpoint of its family would hold it."""
    import transformers

    text = dict(complete_config(hf)["text_config"])
    names = {**transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, **CAUSAL_LM_UNMAPPED}
    if text.get("model_type") not in names:
        raise ConfigError(f"text_config.model_type {text.get('model_type')!r} has no causal LM in transformers")
    text["architectures"] = [names[text["model_type"]]]
    if hf.get("model_type") == "paligemma":  # set by HF's PaliGemmaConfig for its prefix mask, run by the engine
        text.pop("use_bidirectional_attention", None)
    return {**text, "logit_scale": 1.0} if hf.get("model_type") in UNSCALED_LOGITS else text


def read_feature_layers(value: int | list[int], num_layers: int) -> tuple[int, ...]:
    """`vision_feature_layer` (an int or a list) as a tuple; ConfigError for an index outside a num_layers tower."""
    layers = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if any(not -(num_layers + 1) <= i <= num_layers for i in layers):
        raise ConfigError(f"vision_feature_layer {layers} is out of range for {num_layers} tower layers")
    return layers


def read_llava_config(hf: Mapping[str, Any]) -> LlavaConfig:
    """A LlavaConfig from an HF LlavaForConditionalGeneration config; ConfigError naming a field it cannot run."""
    full = complete_config(hf)
    vip = full.get("model_type") == "vipllava"
    # VipLLaVA's get_image_features always drops the first row: it has no strategy field
    strategy = "default" if vip else full.get("vision_feature_select_strategy", "default")
    if strategy not in STRATEGIES:
        raise ConfigError(f"vision_feature_select_strategy {strategy!r} is not supported; supported: {STRATEGIES}")
    act = full.get("projector_hidden_act", "gelu")
    if act not in PROJECTOR_ACTIVATIONS:
        raise ConfigError(f"projector_hidden_act {act!r} is not supported; supported: {PROJECTOR_ACTIVATIONS}")
    vision = read_vision_config(full["vision_config"])
    layers = read_feature_layers(full.get("vision_feature_layer", -2), vision.num_layers)
    cfg = LlavaConfig(
        vision=vision, feature_layers=layers, full=strategy == "full", projector_activation=act,
        projector_bias=full.get("multimodal_projector_bias", True), text_hidden_size=full["text_config"]["hidden_size"],
        image_token_id=full.get("image_token_index", full.get("image_token_id")),
        image_seq_length=full.get("image_seq_length", vision.num_patches),
        projector_norm_eps=float(full["projector_layernorm_eps"]) if vip else None,
    )
    if cfg.image_seq_length != cfg.tokens_per_image:
        raise ConfigError(f"image_seq_length {cfg.image_seq_length} differs from the {cfg.tokens_per_image} rows "
                          f"the tower gives an image ({vision.image_size}px, patch {vision.patch_size}, "
                          f"strategy {strategy!r})")
    return cfg
