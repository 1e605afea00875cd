"""A vision-language checkpoint's tensors: the language model's under their causal-LM names, the
vision tower's and projector's read into `LlavaWeights` (or `Gemma3VisionWeights`).

transformers 5.24 saves LLaVA as `language_model.model.*`, `language_model.lm_head.weight`,
`vision_tower.*`, `multi_modal_projector.*` (LLaVA-NeXT and OneVision also `image_newline`; Gemma 3 and PaliGemma
under `model.`; Idefics3, SmolVLM and Idefics2 as `model.text_model.*`, `model.vision_model.*`, `model.connector.*`,
Idefics2's connector named by checkpoint/idefics2_weights); hub
checkpoints and its in-memory names differ in prefixes (`model.language_model.*`, `vision_tower.vision_model.*`,
`model.multi_modal_projector.*`).
Each part is found by its prefix, so all of them load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np

from jaxinfer.checkpoint.gemma4_vision_weights import read_gemma4_vision_weights
from jaxinfer.checkpoint.glm4v_weights import read_glm4v_weights
from jaxinfer.checkpoint.idefics2_weights import LATENTS, PROJECTION_NAMES, connector_name
from jaxinfer.checkpoint.internvl_weights import is_internvl, read_internvl_weights
from jaxinfer.checkpoint.leaf_paths import leaf_paths, unflatten
from jaxinfer.checkpoint.pixtral_weights import is_pixtral, read_mistral3_weights
from jaxinfer.checkpoint.qwen2_vl_weights import read_qwen2_vl_weights
from jaxinfer.checkpoint.qwen3_vl_weights import read_qwen3_vl_weights
from jaxinfer.config.errors import CheckpointError
from jaxinfer.models.aya_vision import AyaVisionConfig
from jaxinfer.models.gemma3_vision import Gemma3VisionConfig
from jaxinfer.models.gemma4_vision import Gemma4VisionConfig
from jaxinfer.models.glm4v_vision import Glm4vConfig
from jaxinfer.models.idefics2_vision import Idefics2Config
from jaxinfer.models.idefics3_vision import Idefics3VisionConfig
from jaxinfer.models.internvl_vision import InternVLVisionConfig
from jaxinfer.models.paligemma_vision import PaliGemmaConfig
from jaxinfer.models.pixtral_vision import Mistral3Config
from jaxinfer.models.qwen2_vl_vision import Qwen2VLConfig
from jaxinfer.models.qwen3_vl_vision import Qwen3VLConfig
from jaxinfer.models.vision_language import VisionLanguageConfig, VisionLanguageWeights, abstract_vision_language

TEXT_PREFIXES = {"language_model.model.": "model.", "model.language_model.": "model.", "model.text_model.": "model.",
                 "language_model.lm_head.": "lm_head.", "lm_head.": "lm_head.", "model.": "model."}
# Qwen2-VL's tower and merger (`visual.*` in the hub's checkpoints, `model.visual.*` in transformers 5's
# in-memory names); its language model is stored under the causal LM's own names
QWEN_TOWER_PREFIXES = ("visual.", "model.visual.")
QWEN_PATCH = "patch_embed.proj.weight"
TOWER_PREFIXES = ("vision_tower.vision_model.", "model.vision_tower.vision_model.", "vision_tower.",
                  "model.vision_tower.", "model.vision_model.")  # the last: Idefics3's / SmolVLM's
PROJECTOR_PREFIXES = ("multi_modal_projector.", "model.multi_modal_projector.", "model.connector.")
NEWLINE_NAMES = ("image_newline", "model.image_newline")  # LLaVA-NeXT's and OneVision's row after each grid row
LAYER_NAMES = {  # VisionLayer field -> tensor under encoder.layers.{i}.
    "norm1": "layer_norm1.weight", "norm1_bias": "layer_norm1.bias", "wq": "self_attn.q_proj.weight",
    "bq": "self_attn.q_proj.bias", "wk": "self_attn.k_proj.weight", "bk": "self_attn.k_proj.bias",
    "wv": "self_attn.v_proj.weight", "bv": "self_attn.v_proj.bias", "wo": "self_attn.out_proj.weight",
    "bo": "self_attn.out_proj.bias", "norm2": "layer_norm2.weight", "norm2_bias": "layer_norm2.bias",
    "fc1": "mlp.fc1.weight", "fc1_bias": "mlp.fc1.bias", "fc2": "mlp.fc2.weight", "fc2_bias": "mlp.fc2.bias",
}
TOWER_NAMES = {
    "patch": "embeddings.patch_embedding.weight", "patch_bias": "embeddings.patch_embedding.bias",
    "class_embed": "embeddings.class_embedding", "positions": "embeddings.position_embedding.weight",
    "pre_norm": "pre_layrnorm.weight", "pre_norm_bias": "pre_layrnorm.bias",
    "post_norm": "post_layernorm.weight", "post_norm_bias": "post_layernorm.bias",
}
PROJECTOR_NAMES = {"w1": "linear_1.weight", "b1": "linear_1.bias", "w2": "linear_2.weight", "b2": "linear_2.bias",
                   "norm": "projector_layernorm.weight", "norm_bias": "projector_layernorm.bias"}  # norm: VipLLaVA's
# Gemma 3's projector: its matrix is stored [V, D] as it is used (a Parameter, not a Linear: never transposed)
GEMMA3_PROJECTOR_NAMES = {"norm": "mm_soft_emb_norm.weight", "projection": "mm_input_projection_weight"}
IDEFICS3_PROJECTOR_NAMES = {"projection": "modality_projection.proj.weight"}  # its connector's Linear, no bias
AYA_PROJECTOR_NAMES = {"w1": "linear_1.weight", "b1": "linear_1.bias", "w2": "linear_2.weight", "b2": "linear_2.bias",
                       "norm": "layernorm.weight", "norm_bias": "layernorm.bias"}  # SwiGLU's, after its LayerNorm
PALIGEMMA_PROJECTOR_NAMES = {"weight": "linear.weight", "bias": "linear.bias"}  # one Linear


def is_vision_language(index: dict[str, Path]) -> bool:
    """Whether a checkpoint's tensors include a vision tower."""
    return (_prefix(index, TOWER_PREFIXES, TOWER_NAMES["patch"]) or _prefix(index, QWEN_TOWER_PREFIXES, QWEN_PATCH)) \
        is not None or is_pixtral(index) or is_internvl(index)


def language_model_names(index: dict[str, Path]) -> dict[str, str]:
    """Causal-LM tensor name -> stored name of a vision-language checkpoint's language model (the tower's
    and projector's tensors left out); empty for a text-only checkpoint."""
    if not is_vision_language(index):
        return {}
    names = {}
    image_side = TOWER_PREFIXES + PROJECTOR_PREFIXES + QWEN_TOWER_PREFIXES
    for stored in index:
        if stored.startswith(image_side) or stored in NEWLINE_NAMES:
            continue
        for prefix, causal in TEXT_PREFIXES.items():
            if stored.startswith(prefix):
                names[causal + stored[len(prefix):]] = stored
                break
    return names


def _prefix(index: dict[str, Any], prefixes: tuple[str, ...], probe: str) -> str | None:
    return next((p for p in prefixes if p + probe in index), None)


def _stored_name(path: str) -> str:
    """A tower leaf path ('layers.3.wq', 'patch') -> its tensor name under the tower's prefix."""
    parts = path.split(".")
    if parts[0] == "layers":
        return f"encoder.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}"
    return TOWER_NAMES[path]


def _to_jax(name: str, tensor: np.ndarray) -> np.ndarray:
    """Stored layout -> ours: Linear [out, in] transposed, the patch conv [D, C, p, p] as [C * p * p, D]."""
    if name.endswith("patch_embedding.weight"):
        return tensor.reshape(tensor.shape[0], -1).T
    if tensor.ndim == 2 and not name.endswith(("position_embedding.weight", "mm_input_projection_weight", LATENTS)):
        return tensor.T
    return tensor


def read_llava_weights(
    index: dict[str, Path], open_file: Callable[[Path], Any], cfg: VisionLanguageConfig, dtype: Any
) -> VisionLanguageWeights:
    """The tower and projector of a LLaVA (or Gemma 3) checkpoint (its tensor -> file index; open_file opens one
    safetensors file), cast to dtype; CheckpointError naming a missing tensor."""
    if isinstance(cfg, Qwen3VLConfig):
        return read_qwen3_vl_weights(index, open_file, cfg, dtype)
    if isinstance(cfg, Glm4vConfig):
        return read_glm4v_weights(index, open_file, cfg, dtype)
    if isinstance(cfg, Qwen2VLConfig):
        return read_qwen2_vl_weights(index, open_file, cfg, dtype)
    if isinstance(cfg, Mistral3Config):
        return read_mistral3_weights(index, open_file, cfg, dtype)
    if isinstance(cfg, InternVLVisionConfig):
        return read_internvl_weights(index, open_file, cfg, dtype)
    if isinstance(cfg, Gemma4VisionConfig):
        return read_gemma4_vision_weights(index, open_file, cfg, dtype)
    projector_names = GEMMA3_PROJECTOR_NAMES if isinstance(cfg, Gemma3VisionConfig) else \
        IDEFICS3_PROJECTOR_NAMES if isinstance(cfg, Idefics3VisionConfig) else \
        PROJECTION_NAMES if isinstance(cfg, Idefics2Config) else \
        AYA_PROJECTOR_NAMES if isinstance(cfg, AyaVisionConfig) else \
        PALIGEMMA_PROJECTOR_NAMES if isinstance(cfg, PaliGemmaConfig) else PROJECTOR_NAMES
    projector_name = connector_name if isinstance(cfg, Idefics2Config) else projector_names.__getitem__
    probe = next(iter(projector_names.values()))
    tower = _prefix(index, TOWER_PREFIXES, TOWER_NAMES["patch"])
    projector = _prefix(index, PROJECTOR_PREFIXES, probe)
    if tower is None or projector is None:
        raise CheckpointError(f"the checkpoint has no vision tower or multi_modal_projector tensors "
                              f"(looked for {TOWER_PREFIXES[0]}{TOWER_NAMES['patch']} and "
                              f"{PROJECTOR_PREFIXES[0]}{probe})")
    abstract = abstract_vision_language(cfg)
    opened: dict[Path, Any] = {}
    arrays = {}
    for path, info in leaf_paths(abstract):
        part, leaf = path.split(".", 1) if "." in path else (path, "")
        name = tower + _stored_name(leaf) if part == "tower" else projector + projector_name(leaf) \
            if part == "projector" else next((n for n in NEWLINE_NAMES if n in index), NEWLINE_NAMES[0])
        if name not in index:
            raise CheckpointError(f"tensor {name} is missing from the checkpoint (its vision tower or projector)")
        file = index[name]
        if file not in opened:
            opened[file] = open_file(file)
        arrays[path] = jnp.asarray(_checked(name, file, opened[file].get_tensor(name), info.shape), dtype)
    return unflatten(abstract, arrays)


def _checked(name: str, file: Path, stored: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A stored tensor in our layout, its shape checked."""
    tensor = _to_jax(name, stored)
    if tensor.shape != shape:
        raise CheckpointError(f"tensor {name} in {file.name} has shape {stored.shape}, expected {shape} in our layout")
    return tensor
