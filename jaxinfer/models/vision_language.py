"""The vision-language architectures by name: LLaVA's (models/llava), LLaVA-NeXT's and LLaVA-OneVision's
(models/llava_next), Gemma 3's (models/gemma3_vision),
Qwen2-VL's and Qwen2.5-VL's (models/qwen2_vl_vision), Mistral 3's (models/pixtral_vision) and Idefics3's /
SmolVLM's (models/idefics3_vision); Idefics2's (models/idefics2_vision); InternVL's (models/internvl_vision);
Gemma 4's (models/gemma4_vision); Aya Vision's (models/aya_vision) and Cohere2 Vision's (models/cohere2_vision, an
Aya Vision config); PaliGemma's (models/paligemma_vision).

Each runs its language model as the text family its `text_config` names; this module picks what the images
add (config, weight tree, features program) by the checkpoint's architecture or its config's type. Qwen3-VL's
(models/qwen3_vl_vision) and GLM-4.xV's (models/glm4v_vision) are Qwen2-VL configs (their prompts, their M-RoPE
positions) with their own towers.
"""

from __future__ import annotations

from typing import Any, Mapping, Union

import jax
import numpy as np

import jaxinfer.models.aya_vision as aya_vision
import jaxinfer.models.cohere2_vision as cohere2_vision
import jaxinfer.models.gemma3_vision as gemma3_vision
import jaxinfer.models.gemma4_vision as gemma4_vision
import jaxinfer.models.glm4v_vision as glm4v_vision
import jaxinfer.models.idefics2_vision as idefics2_vision
import jaxinfer.models.idefics3_vision as idefics3_vision
import jaxinfer.models.internvl_vision as internvl_vision
import jaxinfer.models.llava as llava
import jaxinfer.models.llava_next as llava_next
import jaxinfer.models.paligemma_vision as paligemma_vision
import jaxinfer.models.pixtral_vision as pixtral_vision
import jaxinfer.models.qwen2_vl_vision as qwen2_vl_vision
import jaxinfer.models.qwen3_vl_vision as qwen3_vl_vision
from jaxinfer.models.aya_vision import AyaVisionConfig, AyaVisionWeights
from jaxinfer.models.gemma3_vision import Gemma3VisionConfig, Gemma3VisionWeights
from jaxinfer.models.gemma4_vision import Gemma4VisionConfig, Gemma4VisionWeights
from jaxinfer.models.glm4v_vision import Glm4vConfig, GlmTowerWeights
from jaxinfer.models.idefics2_vision import Idefics2Config, Idefics2Weights
from jaxinfer.models.idefics3_vision import Idefics3VisionConfig, Idefics3Weights
from jaxinfer.models.internvl_vision import InternVLVisionConfig, InternVLWeights
from jaxinfer.models.llava import LlavaConfig, LlavaWeights
from jaxinfer.models.llava_next import LlavaNextConfig
from jaxinfer.models.paligemma_vision import PaliGemmaConfig, PaliGemmaWeights
from jaxinfer.models.pixtral_vision import Mistral3Config, PixtralWeights
from jaxinfer.models.qwen2_vl_vision import Qwen2VLConfig, QwenTowerWeights
from jaxinfer.models.qwen3_vl_vision import Qwen3TowerWeights, Qwen3VLConfig

ARCHITECTURES = llava.ARCHITECTURES + gemma3_vision.ARCHITECTURES + (qwen2_vl_vision.QWEN2_VL,
                                                                    qwen2_vl_vision.QWEN2_5_VL) + \
    qwen3_vl_vision.ARCHITECTURES + pixtral_vision.ARCHITECTURES + idefics3_vision.ARCHITECTURES + \
    internvl_vision.ARCHITECTURES + llava_next.ARCHITECTURES + idefics2_vision.ARCHITECTURES + \
    aya_vision.ARCHITECTURES + glm4v_vision.ARCHITECTURES + cohere2_vision.ARCHITECTURES + \
    paligemma_vision.ARCHITECTURES
# Those and Gemma 4's take images; Gemma 4's language model is read as its own family's (models/text_part), not
# through the registry's vision-language path
IMAGE_ARCHITECTURES = ARCHITECTURES + gemma4_vision.ARCHITECTURES
VisionLanguageConfig = Union[LlavaConfig, Gemma3VisionConfig, Qwen2VLConfig, Mistral3Config, Idefics3VisionConfig,
                             InternVLVisionConfig, Gemma4VisionConfig, Idefics2Config, AyaVisionConfig,
                             PaliGemmaConfig]
VisionLanguageWeights = Union[LlavaWeights, Gemma3VisionWeights, QwenTowerWeights, Qwen3TowerWeights, PixtralWeights,
                              Idefics3Weights, InternVLWeights, Gemma4VisionWeights, Idefics2Weights, AyaVisionWeights,
                              GlmTowerWeights, PaliGemmaWeights]


def read_vision_language_config(hf: Mapping[str, Any]) -> VisionLanguageConfig:
    """The image side of a vision-language checkpoint's config (by its architecture)."""
    if hf["architectures"][0] in gemma3_vision.ARCHITECTURES:
        return gemma3_vision.read_gemma3_vision_config(hf)
    if hf["architectures"][0] in (qwen2_vl_vision.QWEN2_VL, qwen2_vl_vision.QWEN2_5_VL):
        return qwen2_vl_vision.read_qwen2_vl_config(hf)
    if hf["architectures"][0] in qwen3_vl_vision.ARCHITECTURES:
        return qwen3_vl_vision.read_qwen3_vl_config(hf)
    if hf["architectures"][0] in glm4v_vision.ARCHITECTURES:
        return glm4v_vision.read_glm4v_config(hf)
    if hf["architectures"][0] in pixtral_vision.ARCHITECTURES:
        return pixtral_vision.read_mistral3_config(hf)
    if hf["architectures"][0] in idefics3_vision.ARCHITECTURES:
        return idefics3_vision.read_idefics3_config(hf)
    if hf["architectures"][0] in idefics2_vision.ARCHITECTURES:
        return idefics2_vision.read_idefics2_config(hf)
    if hf["architectures"][0] in internvl_vision.ARCHITECTURES:
        return internvl_vision.read_internvl_config(hf)
    if hf["architectures"][0] in gemma4_vision.ARCHITECTURES:
        return gemma4_vision.read_gemma4_vision_config(hf)
    if hf["architectures"][0] in llava_next.ARCHITECTURES:
        return llava_next.read_llava_next_config(hf)
    if hf["architectures"][0] in aya_vision.ARCHITECTURES:
        return aya_vision.read_aya_vision_config(hf)
    if hf["architectures"][0] in cohere2_vision.ARCHITECTURES:
        return cohere2_vision.read_cohere2_vision_config(hf)
    if hf["architectures"][0] in paligemma_vision.ARCHITECTURES:
        return paligemma_vision.read_paligemma_config(hf)
    return llava.read_llava_config(hf)


def abstract_vision_language(cfg: VisionLanguageConfig) -> Any:
    """The tower and projector leaves as ArrayInfos."""
    if isinstance(cfg, Gemma3VisionConfig):
        return gemma3_vision.abstract_gemma3_vision(cfg)
    if isinstance(cfg, Qwen3VLConfig):
        return qwen3_vl_vision.abstract_qwen3_vl(cfg)
    if isinstance(cfg, Glm4vConfig):
        return glm4v_vision.abstract_glm4v(cfg)
    if isinstance(cfg, Qwen2VLConfig):
        return qwen2_vl_vision.abstract_qwen2_vl(cfg)
    if isinstance(cfg, Mistral3Config):
        return pixtral_vision.abstract_mistral3(cfg)
    if isinstance(cfg, Idefics3VisionConfig):
        return idefics3_vision.abstract_idefics3(cfg)
    if isinstance(cfg, Idefics2Config):
        return idefics2_vision.abstract_idefics2(cfg)
    if isinstance(cfg, InternVLVisionConfig):
        return internvl_vision.abstract_internvl(cfg)
    if isinstance(cfg, Gemma4VisionConfig):
        return gemma4_vision.abstract_gemma4_vision(cfg)
    if isinstance(cfg, LlavaNextConfig):
        return llava_next.abstract_llava_next(cfg)
    if isinstance(cfg, AyaVisionConfig):
        return aya_vision.abstract_aya_vision(cfg)
    if isinstance(cfg, PaliGemmaConfig):
        return paligemma_vision.abstract_paligemma(cfg)
    return llava.abstract_llava(cfg)


def image_features(weights: VisionLanguageWeights, pixels: jax.Array, cfg: VisionLanguageConfig) -> jax.Array:
    """Language-model embeddings [N, image_seq_length, D] of images [N, C, H, W] (Qwen2-VL's: [1, bucket, D] of
    one image's padded patches, models/tower_patches; Qwen3-VL's: [1, bucket, (1 + K) * D], its K DeepStack rows
    beside; Mistral 3's: [1, R * (C + 1), D] of one image [1, C, H, W] at its own size; Idefics3's, InternVL's and
    Aya Vision's: [N, image_seq_len, D] of tiles [N, C, S, S]; Gemma 4's: [1, bucket, D] of one image's padded
    patches; LLaVA-NeXT's and OneVision's: [N, patches, D] of tiles [N, C, S, S], laid out on the host by
    `llava_next.image_layout`; Idefics2's: [N, latents, D] of `idefics2_vision.MaskedTiles`)."""
    if isinstance(cfg, Gemma3VisionConfig):
        return gemma3_vision.image_features(weights, pixels, cfg)
    if isinstance(cfg, Qwen3VLConfig):
        return qwen3_vl_vision.image_features(weights, pixels, cfg)
    if isinstance(cfg, Glm4vConfig):
        return glm4v_vision.image_features(weights, pixels, cfg)
    if isinstance(cfg, Qwen2VLConfig):
        return qwen2_vl_vision.image_features(weights, pixels, cfg)
    if isinstance(cfg, Mistral3Config):
        return pixtral_vision.image_features(weights, pixels, cfg)
    if isinstance(cfg, Idefics3VisionConfig):
        return idefics3_vision.image_features(weights, pixels, cfg)
    if isinstance(cfg, Idefics2Config):
        return idefics2_vision.image_features(weights, pixels, cfg)
    if isinstance(cfg, InternVLVisionConfig):
        return internvl_vision.image_features(weights, pixels, cfg)
    if isinstance(cfg, Gemma4VisionConfig):
        return gemma4_vision.image_features(weights, pixels, cfg)
    if isinstance(cfg, AyaVisionConfig):
        return aya_vision.image_features(weights, pixels, cfg)
    if isinstance(cfg, PaliGemmaConfig):
        return paligemma_vision.image_features(weights, pixels, cfg)
    return llava.image_features(weights, pixels, cfg)


def blank_pixels(cfg: VisionLanguageConfig) -> np.ndarray:
    """Zero pixels of one image as the tower takes it (what warm-up compiles; Qwen2-VL, Mistral 3: one merged
    block, Gemma 4: one pooled row; their other sizes compile on first use; Idefics2's: its pixel mask a channel
    more)."""
    if isinstance(cfg, Gemma4VisionConfig):
        return gemma4_vision.blank_pixels(cfg)
    if isinstance(cfg, Qwen2VLConfig):
        return qwen2_vl_vision.blank_pixels(cfg)
    if isinstance(cfg, Mistral3Config):
        return pixtral_vision.blank_pixels(cfg)
    v = cfg.vision
    channels = v.num_channels + int(isinstance(cfg, Idefics2Config))
    return np.zeros((channels, v.image_size, v.image_size), np.float32)


def mark_token_id(cfg: VisionLanguageConfig) -> int:
    """The token a prompt marks each image with (LLaVA's image token; Gemma 3's start of image)."""
    return cfg.boi_token_id if isinstance(cfg, Gemma3VisionConfig) else cfg.image_token_id


def deepstack_layers(cfg: VisionLanguageConfig | None) -> int:
    """How many language-model layers add an image's DeepStack rows (Qwen3-VL's); 0 for the others."""
    return cfg.deepstack_layers if isinstance(cfg, Qwen3VLConfig) else 0


def bidirectional(cfg: VisionLanguageConfig | None) -> bool:
    """Whether some tokens attend past their position (steps carry key ends, a prefill chunk must hold a whole image):
    Gemma 3's images; Gemma 4's on its sliding layers where its text config says so (models/gemma4_vision);
    PaliGemma's whole prompt (`whole_prompt`)."""
    return isinstance(cfg, (Gemma3VisionConfig, PaliGemmaConfig)) or \
        (isinstance(cfg, Gemma4VisionConfig) and cfg.bidirectional)


def whole_prompt(cfg: VisionLanguageConfig | None) -> bool:
    """Whether a prompt is one bidirectional prefix (PaliGemma's: HF's token_type_ids 0 for image tokens, bos, text
    and the closing "\n"), generated tokens causal: every prompt token sees up to the prompt's end."""
    return isinstance(cfg, PaliGemmaConfig)


def tiled(cfg: VisionLanguageConfig) -> bool:
    """Whether images reach the tower as tiles all of its image size (Idefics3's, InternVL's, Aya Vision's; Idefics2's
    padded to it): a request's new tiles go through together."""
    return isinstance(cfg, (Idefics3VisionConfig, InternVLVisionConfig, Idefics2Config, AyaVisionConfig))


def anyres(cfg: VisionLanguageConfig | None) -> bool:
    """Whether an image is a stack of tiles whose rows are laid out on the host (LLaVA-NeXT's, OneVision's): its
    `ImageInput` holds all its tiles and their layout."""
    return isinstance(cfg, LlavaNextConfig)
