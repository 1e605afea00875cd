"""Tencent Youtu-LLM (YoutuForCausalLM: Youtu-LLM-2B): DeepSeek-V3's latent attention in a dense Llama layer.

Every layer is DeepSeek's dense layer (`deepseek`: multi-head latent attention over a compressed
cache, then a gated MLP of `intermediate_size`); there are no experts, so none of DeepSeek's routing
fields is read. Rotary pairs are adjacent with `rope_interleave` (the default), as DeepSeek-V3's;
the head is tied to the embedding by default. Fields a config leaves out take YoutuConfig's defaults.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ModelConfig, activation_name, common_fields, uniform_windows
from jaxinfer.models.deepseek import KEPT_NULL, abstract_layer, decoder_layer, hf_leaves, latent_fields
from jaxinfer.models.family import Family

ARCHITECTURES = ("YoutuForCausalLM",)
# YoutuConfig's defaults (DeepSeek-V3's MLA dims) for fields a config leaves out or nulls.
DEFAULTS = dict(kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                max_position_embeddings=131072, bos_token_id=128000, eos_token_id=128001, tie_word_embeddings=True,
                rope_interleave=True)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Youtu HF config: DeepSeek's latent attention fields, every layer dense."""
    hf = {**DEFAULTS, **{key: value for key, value in hf.items() if value is not None or key in KEPT_NULL}}
    fields = common_fields(hf, arch)
    return ModelConfig(
        **latent_fields(hf, fields, bool(hf["rope_interleave"])),
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
    )


FAMILY = Family("youtu", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
