"""The GLM family (GLM-4-9B-chat-hf, glm-edge): the Llama layer with GLM's rotary embeddings.

Rotary embeddings turn only the leading `partial_rotary_factor` of each head (0.5 unless set),
pairing adjacent dims (2i, 2i + 1) rather than the two halves (`cfg.rope_interleaved`). q/k/v
are biased (`attention_bias`, on by default), the output projection never is, and the MLP's gate
and up projections are one `gate_up_proj` tensor, read as its two row ranges at load. GLM-4-0414
(`glm4.py`) reads its config here too.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.llama import abstract_layer, decoder_layer
from jaxinfer.models.self_attention import attention_hf_leaves

ARCHITECTURES = ("GlmForCausalLM",)
# GlmConfig's / Glm4Config's defaults for the fields a config leaves out (common_fields has others).
DEFAULTS = dict(num_key_value_heads=2, head_dim=128, rms_norm_eps=1.5625e-7, max_position_embeddings=131072,
                attention_bias=True, eos_token_id=[151329, 151336, 151338])
PARTIAL_ROTARY_FACTOR = 0.5


def mlp_hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """The MLP: gate and up as the first and second half of the rows of `gate_up_proj`."""
    D, F, mlp = cfg.hidden_size, cfg.intermediate_size, "model.layers.{i}.mlp."
    gate_up = (mlp + "gate_up_proj.weight", "transpose", (2 * F, D))
    return {
        "w_gate": HFLeaf(*gate_up),
        "w_up": HFLeaf(*gate_up, row_offset=F),
        "w_down": HFLeaf(mlp + "down_proj.weight", "transpose", (D, F)),
    }


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives in an HF checkpoint."""
    D, layer = cfg.hidden_size, "model.layers.{i}."
    return {
        "attn_norm": HFLeaf(layer + "input_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf(layer + "post_attention_layernorm.weight", "same", (D,)),
        **attention_hf_leaves(cfg),
        **mlp_hf_leaves(cfg),
    }


def rotary_dim(hf: Mapping[str, Any], head_dim: int) -> int:
    """Rotated dims per head: `partial_rotary_factor` from the rope parameters, else the top level, else 0.5
    (transformers' order: the top-level value only fills in for one the rope parameters lack)."""
    params = {**(hf.get("rope_parameters") or {}), **(hf.get("rope_scaling") or {})}
    factor = float(field(params, "partial_rotary_factor", field(hf, "partial_rotary_factor", PARTIAL_ROTARY_FACTOR)))
    dims = int(head_dim * factor)
    if not 0 < factor <= 1 or dims % 2:
        raise ConfigError(f"partial_rotary_factor {factor} must be in (0, 1] and turn an even number of the "
                          f"{head_dim} head dims (it turns {dims})")
    return dims


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a GLM or GLM-4-0414 HF config (fields it leaves out or nulls take GlmConfig's defaults)."""
    hf = {**DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    fields = common_fields(hf, arch)
    return ModelConfig(
        **fields,
        rotary_dim=rotary_dim(hf, fields["head_dim"]),
        rope_interleaved=True,
        qkv_bias=bool(hf["attention_bias"]),
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
    )


FAMILY = Family("glm", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
