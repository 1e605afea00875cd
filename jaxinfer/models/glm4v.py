"""GLM-4.1V, GLM-4.5V and GLM-4.6V's language models: GLM-4-0414's decoder (Glm4ForCausalLM: a norm after each
sublayer) or GLM-4.5's MoE decoder (Glm4MoeForCausalLM) with Qwen2-VL's M-RoPE (models/qwen2_vl).

The rotary frequencies of the rotated dims are split into `mrope_section` (temporal, height, width) parts one after
another, as Qwen2-VL's (transformers' default [8, 12, 12] of 32); the rotated dims are the leading
`partial_rotary_factor` of each head. The dense model pairs adjacent dims (GLM's layout, `rope_interleaved`), rotates
all of each head unless the factor says otherwise and takes its head size from hidden_size / num_attention_heads,
whatever `head_dim` says; the MoE one turns dims i and i + rotated/2 (rotate-half) over half of each head by default.
Both have q/k/v biases. GLM-4.6V (`Glm46VForConditionalGeneration`) runs whichever of the two its text_config's
model_type names. The vision side is models/glm4v_vision.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError
from jaxinfer.models.qwen2_vl import GLM4V_ARCHITECTURES, qwen2_text_config

ARCHITECTURES = GLM4V_ARCHITECTURES
DENSE_TYPE, MOE_TYPE = "glm4v_text", "glm4v_moe_text"
TEXT_TYPES = {DENSE_TYPE: "Glm4ForCausalLM", MOE_TYPE: "Glm4MoeForCausalLM"}  # text_config.model_type -> family
ARCHITECTURE_TEXT_TYPES = {"Glm4vForConditionalGeneration": DENSE_TYPE, "Glm4vMoeForConditionalGeneration": MOE_TYPE}
# transformers' Glm4vTextConfig / Glm4vMoeTextConfig defaults where our GLM families' differ
DEFAULTS = {DENSE_TYPE: dict(num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=32768),
            MOE_TYPE: dict(num_key_value_heads=8, rms_norm_eps=1e-5, max_position_embeddings=65536,
                           attention_bias=True)}
PARTIAL_ROTARY = {DENSE_TYPE: 1.0, MOE_TYPE: 0.5}


def text_type(hf: Mapping[str, Any]) -> str:
    """The language model's model_type: the architecture's, or GLM-4.6V's text_config's; ConfigError otherwise."""
    arch = hf["architectures"][0]
    text = hf.get("text_config") or {}
    kind = ARCHITECTURE_TEXT_TYPES.get(arch) or text.get("model_type", DENSE_TYPE)
    if kind not in TEXT_TYPES:
        raise ConfigError(f"text_config.model_type {kind!r} is not supported for {arch}; supported: "
                          f"{', '.join(TEXT_TYPES)}")
    return kind


def glm4v_text_config(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's config as a Glm4ForCausalLM / Glm4MoeForCausalLM checkpoint would hold it (its defaults
    transformers', the rope without sections)."""
    kind = text_type(hf)
    text = {**DEFAULTS[kind], **{k: v for k, v in qwen2_text_config(hf, TEXT_TYPES[kind]).items() if v is not None}}
    rope = text["rope_parameters"]
    rope.setdefault("partial_rotary_factor", text.pop("partial_rotary_factor", PARTIAL_ROTARY[kind]))
    heads = int(text["num_attention_heads"])
    if kind == DENSE_TYPE:  # Glm4vTextAttention: head size from the width, biased q/k/v
        return {**text, "head_dim": int(text["hidden_size"]) // heads, "attention_bias": True}
    return {**text, "head_dim": int(text.get("head_dim") or int(text["hidden_size"]) // heads),
            "num_nextn_predict_layers": 0}  # Glm4vMoeTextModel runs its first num_hidden_layers only
