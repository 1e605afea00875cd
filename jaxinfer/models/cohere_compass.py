"""Cohere Compass (North): CohereCompassForCausalLM, and CohereCompassForConditionalGeneration's language model run
text-only.

transformers builds its text model from Cohere 2's parts (models/cohere2: one bias-free LayerNorm feeding attention
and the gated MLP side by side, `logit_scale` on the logits) with two changes read here:
- the rope is per layer type: `rope_parameters` maps each of `layer_types` to its own parameters (Qwen3-VL's M-RoPE
  sections over one theta, which text-only positions, equal on every axis, reduce to the plain rope), or to null
  for a type without rotary embeddings; q and k rotate in halves (`rotate_half`), not Cohere 2's adjacent pairs;
- its defaults: every layer full unless `layer_types` says otherwise, no logit scale (1), head_dim forced to
  hidden_size / num_attention_heads.
Its conditional-generation checkpoint is Qwen3-VL's layout (`model.language_model.*`, `lm_head.*`, the tower under
`model.visual.*`): the tower is not run (models/text_part), an image or video refused by name.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, layer_types
from jaxinfer.models.cohere2 import abstract_layer, decoder_layer, hf_leaves
from jaxinfer.models.family import Family

ARCHITECTURES = ("CohereCompassForCausalLM", "CohereCompassForConditionalGeneration")
# CohereCompassTextConfig's defaults for fields a config leaves out.
DEFAULTS = dict(max_position_embeddings=8192, layer_norm_eps=1e-5, bos_token_id=5, eos_token_id=255001,
                tie_word_embeddings=True, sliding_window=4096)


def type_thetas(hf: Mapping[str, Any], types: list[str], arch: str) -> dict[str, float | None]:
    """Each layer type's rope theta (None: no rotary embeddings), from `rope_parameters` keyed by layer type."""
    params = hf.get("rope_parameters")
    if not isinstance(params, Mapping) or not set(types) <= set(params):
        raise ConfigError(f"rope_parameters {params!r} is not supported for {arch}: transformers reads one entry per "
                          f"layer type ({sorted(set(types))}), each a dict or null (no rotary embeddings)")
    thetas = {}
    for kind in sorted(set(types)):
        entry = params[kind]
        if entry is not None and (not isinstance(entry, Mapping) or entry.get("rope_type", "default") != "default"):
            raise ConfigError(f"rope_parameters[{kind!r}] {entry!r} is not supported for {arch}: accepted is the "
                              "default rope (rope_type 'default' with a rope_theta) or null")
        thetas[kind] = None if entry is None else float(entry.get("rope_theta", 10000.0))
    return thetas


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Cohere Compass text config."""
    hf = {**DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    num_layers = int(hf["num_hidden_layers"])
    types = layer_types(hf, num_layers) or ["full_attention"] * num_layers
    thetas = type_thetas(hf, types, arch)
    window, scale = hf["sliding_window"], hf.get("logit_scale", 1.0)
    if "sliding_attention" in types and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ConfigError(f"sliding_window {window!r} is not supported for {arch} with sliding layers: an integer >= 1")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0:
        raise ConfigError(f"logit_scale {scale!r} is not supported for {arch}: a number > 0")
    fields = common_fields({key: v for key, v in hf.items() if key not in ("rope_parameters", "rope_scaling")}, arch)
    bias = bool(hf.get("attention_bias", False))
    full_theta, local_theta = thetas.get("full_attention"), thetas.get("sliding_attention")
    return ModelConfig(
        **{**fields, "rms_norm_eps": float(hf["layer_norm_eps"]),
           "head_dim": fields["hidden_size"] // fields["num_heads"], "rope_theta": full_theta or local_theta or 1e4},
        local_rope_theta=local_theta,
        layer_norm=True,
        qkv_bias=bias,
        o_bias=bias,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        logits_scaling=1.0 / float(scale),
        layer_windows=tuple(int(window) if t == "sliding_attention" else 0 for t in types),
        nope_layers=tuple(i for i, t in enumerate(types) if thetas[t] is None),
    )


FAMILY = Family("cohere_compass", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
