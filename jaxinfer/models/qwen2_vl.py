"""Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3.5's language model: Qwen2's (Qwen3's, Qwen3-MoE's, Qwen3.5's hybrid)
decoder with multimodal rotary embeddings (M-RoPE).

The rotary frequencies are split into `mrope_section` (temporal, height, width) parts, each turned by its own
position stream; a text token has all three streams equal, which is Qwen2's rope, so the language model runs as
`Qwen2ForCausalLM` with the sections kept in `ModelConfig.mrope_section` for the image tokens' positions.
Configs come nested (transformers 5: `text_config`) or flat (the hub's: text fields beside `vision_config`,
`rope_scaling` {"type": "mrope", "mrope_section": [...]}); both are read. Qwen3-VL interleaves the sections
(frequencies owned t, h, w in turn: models/rope's `mrope_owners`) whatever its `mrope_interleaved` says, as HF does;
Qwen3-VL-MoE's experts always renormalise their routing weights. Qwen3.5 interleaves Qwen3-VL's way over its partial
rotary (`partial_rotary_factor` of each head, kept: its sections add up to the rotated dims' frequencies, default
[11, 11, 10]); its language model is models/qwen3_5's, the MoE one reading the hub's fused experts unless the
checkpoint stores one tensor per expert (qwen3_5.experts_as_stored). GLM-4.xV's configs read their text model here too
(models/glm4v: `qwen2_text_config` with GLM's architecture, the sections one after another, [8, 12, 12] by default).
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError

GLM4V_ARCHITECTURES = ("Glm4vForConditionalGeneration", "Glm4vMoeForConditionalGeneration",
                       "Glm46VForConditionalGeneration")  # their text configs: models/glm4v

TEXT_ARCHITECTURES = {  # the checkpoint's -> its language model's (the Qwen3-VL-MoE one reads experts fused)
    "Qwen2VLForConditionalGeneration": "Qwen2ForCausalLM", "Qwen2_5_VLForConditionalGeneration": "Qwen2ForCausalLM",
    "Qwen3VLForConditionalGeneration": "Qwen3ForCausalLM",
    "Qwen3VLMoeForConditionalGeneration": "Qwen3VLMoeTextForCausalLM",
    "Qwen3_5ForConditionalGeneration": "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForConditionalGeneration": "Qwen3_5MoeTextForCausalLM",
}
ARCHITECTURES = tuple(TEXT_ARCHITECTURES)
INTERLEAVED = ("Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
               "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
# transformers' default sections: Qwen3.5's over its quarter-head rotary (32 frequencies), the others' over 64
DEFAULT_SECTIONS = {"Qwen3_5ForConditionalGeneration": (11, 11, 10), "Qwen3_5MoeForConditionalGeneration": (11, 11, 10),
                    **dict.fromkeys(GLM4V_ARCHITECTURES, (8, 12, 12))}  # GLM-4.xV's over its 32 rotary frequencies
MROPE_TYPES = ("default", "mrope")  # "mrope" is the hub's name for the default rope split into sections
# Settings of the whole checkpoint a flat config keeps beside the text model's (not the language model's)
NOT_TEXT = ("vision_config", "architectures", "model_type", "image_token_id", "video_token_id",
            "vision_start_token_id", "vision_end_token_id", "vision_token_id", "text_config")
TOP_LEVEL = ("tie_word_embeddings", "quantization_config")  # the checkpoint's, read over text_config's


def qwen2_text_config(hf: Mapping[str, Any], architecture: str | None = None) -> dict[str, Any]:
    """The language model's config as a Qwen2ForCausalLM (Qwen3ForCausalLM, ...; `architecture` when given: GLM-4.xV's)
    checkpoint would hold it (rope without sections)."""
    nested = hf.get("text_config")
    text = dict(nested) if isinstance(nested, Mapping) else {k: v for k, v in hf.items() if k not in NOT_TEXT}
    text.update({k: hf[k] for k in TOP_LEVEL if hf.get(k) is not None})
    params = {**(text.pop("rope_parameters", None) or {}), **(text.pop("rope_scaling", None) or {})}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in MROPE_TYPES:
        raise ConfigError(f"rope type {rope_type!r} is not supported for {hf['architectures'][0]}; "
                          f"supported: {', '.join(MROPE_TYPES)}")
    theta = params.get("rope_theta", text.pop("rope_theta", 10000.0))
    partial = {"partial_rotary_factor": params["partial_rotary_factor"]} if "partial_rotary_factor" in params else {}
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": theta, **partial}
    text["architectures"] = [architecture or TEXT_ARCHITECTURES[hf["architectures"][0]]]
    if hf["architectures"][0] == "Qwen3VLMoeForConditionalGeneration":
        text["norm_topk_prob"] = True
    return text


def mrope_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The ModelConfig fields of the checkpoint's M-RoPE: its sections, and whether they interleave (Qwen3-VL)."""
    return dict(mrope_section=mrope_section(hf), mrope_interleaved=hf["architectures"][0] in INTERLEAVED)


def mrope_section(hf: Mapping[str, Any]) -> tuple[int, ...]:
    """The (temporal, height, width) frequency counts of the config's M-RoPE (transformers' default when it names
    none: [16, 24, 24], Qwen3.5's [11, 11, 10])."""
    nested = hf.get("text_config")
    text = nested if isinstance(nested, Mapping) else hf
    params = {**(text.get("rope_parameters") or {}), **(text.get("rope_scaling") or {})}
    default = DEFAULT_SECTIONS.get(hf["architectures"][0], (16, 24, 24))
    section = tuple(int(s) for s in params.get("mrope_section") or default)
    if len(section) != 3:
        raise ConfigError(f"mrope_section {list(section)} must give 3 frequency counts (temporal, height, width)")
    return section
