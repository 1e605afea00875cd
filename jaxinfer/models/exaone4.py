"""LG AI Research EXAONE 4.0 (Exaone4ForCausalLM: EXAONE-4.0-32B, EXAONE-4.0-1.2B): OLMo 2's post-norm layer
with per-head q/k norms, sliding-window layers and rotary embeddings on the sliding layers only.

Each sublayer's output is normed before the residual add (`post_attention_layernorm`,
`post_feedforward_layernorm`; no input norms), as in OLMo 2 (`olmo2.py`, whose layer and weights
these are), but the q/k RMSNorms are per head (one [head_dim] weight, as Qwen3's). `layer_types`,
or else every `sliding_window_pattern`-th layer full (4 by default), picks the layers that slide
over `sliding_window` tokens. With a sliding window set, only the sliding layers rotate q and k;
the full-attention layers take no positional embedding (`cfg.nope_layers`, "global NoPE"). A null
`sliding_window` means full attention with rotary embeddings in every layer. Fields a config leaves
out take transformers' Exaone4Config defaults. EXAONE 4.5's Exaone4_5_ForConditionalGeneration runs this language
model (its text config is an Exaone4Config) in Qwen2-VL's layout: text only, its tower skipped (models/text_part).
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, layer_types
from jaxinfer.models.family import Family
from jaxinfer.models.olmo2 import abstract_layer, decoder_layer, hf_leaves

ARCHITECTURES = ("Exaone4ForCausalLM", "Exaone4_5_ForConditionalGeneration")
# Exaone4Config's defaults for fields a config leaves out (a null sliding_window stays null: no sliding layers).
DEFAULTS = dict(num_key_value_heads=32, max_position_embeddings=2048, rms_norm_eps=1e-5, bos_token_id=0,
                eos_token_id=2, sliding_window=4096, sliding_window_pattern=4)


def sliding_layers(hf: Mapping[str, Any], num_layers: int) -> list[bool]:
    """Whether each layer slides: `layer_types`, else all but every `sliding_window_pattern`-th layer (an int, as
    transformers reads it; a null window: none)."""
    types = layer_types(hf, num_layers)
    if types is not None:
        return [t == "sliding_attention" for t in types]
    if hf["sliding_window"] is None:
        return [False] * num_layers
    pattern = hf["sliding_window_pattern"]
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
        raise ConfigError(f"sliding_window_pattern {pattern!r} is not supported without layer_types: an integer >= 1 "
                          "(every pattern-th layer full), as transformers reads it; or list layer_types")
    return [(i + 1) % pattern != 0 for i in range(num_layers)]


def attention_fields(hf: Mapping[str, Any], arch: str, num_layers: int) -> dict[str, Any]:
    """The attention's ModelConfig fields (per-head q/k norms, windows, the global NoPE layers) of a config whose
    defaults are filled in, keeping a null `sliding_window` (EXAONE-MoE reads its attention here too)."""
    window = hf["sliding_window"]
    sliding = sliding_layers(hf, num_layers)
    if window is None and any(sliding):
        raise ConfigError(f"layer_types has sliding layers but sliding_window is null for {arch}; set sliding_window")
    if window is not None and int(window) < 1:
        raise ConfigError(f"sliding_window {window} must be >= 1 (or null for full attention in every layer)")
    return dict(qk_norm=True, layer_windows=tuple(int(window) if s else 0 for s in sliding),
                nope_layers=() if window is None else tuple(i for i, s in enumerate(sliding) if not s))


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an EXAONE 4.0 HF config."""
    hf = {**DEFAULTS, **hf}
    fields = common_fields(hf, arch)
    return ModelConfig(**fields, activation=activation_name(hf.get("hidden_act") or "silu"),
                       **attention_fields(hf, arch, fields["num_layers"]))


FAMILY = Family("exaone4", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
