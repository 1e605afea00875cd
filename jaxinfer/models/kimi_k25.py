"""Kimi K2.5 (Kimi_K25ForConditionalGeneration; the hub's KimiK25ForConditionalGeneration): its language model run
text-only, as DeepSeek-V3's.

transformers builds the language model from `text_config` as DeepseekV3Model (the hub's model_type "kimi_k2" is read
as "deepseek_v3"), so the layers are `models.deepseek`'s with V3's noaux_tc routing (the MoE layers hold
e_score_correction_bias) and V3's defaults for the fields the text config leaves out. Moonshot's checkpoint keeps the
causal LM under `language_model.` (`language_model.model.layers.*`, `language_model.lm_head.weight`) beside the
MoonViT tower (`vision_tower.*`) and its projector (`mm_projector.*`), which are skipped (`models.text_part`): no
image or video reaches the model. A checkpoint transformers 5 saves names the layers `language_model.model.blocks.*`
(it reverses the tower's rename of `blocks` onto them) and reads them back so: read under either name. Speculative
"mtp" is DeepseekV3ForCausalLM's only (Kimi K2.5 ships no MTP layers).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Collection, Mapping

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.deepseek import V3, abstract_layer, decoder_layer, hf_leaves, read_config
from jaxinfer.models.family import Family, HFLeaf

ARCHITECTURES = ("Kimi_K25ForConditionalGeneration", "KimiK25ForConditionalGeneration")
SAVED_LAYERS = re.compile(r"^language_model\.model\.blocks\.")


def _read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """DeepSeek-V3's reading of the text config, under the checkpoint's architecture (which says where its tensors
    sit: `models.text_part`)."""
    return dataclasses.replace(read_config(hf, V3), architecture=arch)


def _abstract_layer(cfg: ModelConfig, layer: int) -> Any:
    """DeepSeek-V3's layer leaves: the MoE layers hold e_score_correction_bias."""
    return abstract_layer(cfg, layer, correction=True)


def _hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """DeepSeek-V3's tensor names (per-expert experts), the correction bias too."""
    return hf_leaves(cfg, correction=True)


def stored_names(names: Collection[str]) -> dict[str, str]:
    """Tensor name -> the name stored, for a checkpoint transformers saved (`language_model.model.blocks.*`); empty
    for Moonshot's (`language_model.model.layers.*`), read as named."""
    if not any(SAVED_LAYERS.match(name) for name in names):
        return {}
    return {SAVED_LAYERS.sub("language_model.model.layers.", name): name for name in names}


FAMILY = Family("kimi_k25", ARCHITECTURES, _read_config, _abstract_layer, _hf_leaves, decoder_layer,
                stored_names=stored_names)
