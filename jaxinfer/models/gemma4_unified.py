"""Gemma 4 Unified (text): Gemma4UnifiedForCausalLM, and Gemma4UnifiedForConditionalGeneration's language model run
text-only.

transformers' Gemma4Unified text model is Gemma 4's (models/gemma4) less two parts: its layer is Gemma 2's sandwich
around Gemma 4's attention (per-layer K/V shapes, k_eq_v, KV sharing) and MLP (double-wide on the sharing layers),
times `layer_scalar`, with no per-layer inputs and no MoE block: its config class removes those fields, so they are
read as off whatever a config says. Its defaults differ (a 1024-token window, 262144 positions). Its images (an
encoder-free patch embedder, `model.vision_embedder.*` and `model.embed_vision.*`) and audio (`model.embed_audio.*`)
are not run: the conditional-generation checkpoint runs text only (models/text_part), an image or audio refused by
name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.gemma4 import FAMILY as GEMMA4
from jaxinfer.models.gemma4_config import read_config as read_gemma4_config

ARCHITECTURES = ("Gemma4UnifiedForCausalLM", "Gemma4UnifiedForConditionalGeneration")
# Gemma4UnifiedTextConfig's defaults where Gemma4TextConfig's differ.
DEFAULTS = {"sliding_window": 1024, "max_position_embeddings": 262_144}
# The Gemma 4 parts transformers does not build for this model, whatever the config holds.
ABSENT = {"hidden_size_per_layer_input": 0, "enable_moe_block": False}


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Gemma4Unified text config: Gemma 4's reading, without per-layer inputs or experts."""
    given = {key: value for key, value in hf.items() if value is not None}
    return read_gemma4_config({**DEFAULTS, **given, **ABSENT}, arch)


FAMILY = dataclasses.replace(GEMMA4, name="gemma4_unified", architectures=ARCHITECTURES,
                             read_config=read_config)
