"""GLM-4.7-Flash (Glm4MoeLiteForCausalLM): DeepSeek-V3's layer under GLM's name and defaults.

transformers builds it from DeepseekV3Attention (latent attention: a low-rank query, one compressed row cached per
token, rope on the qk_rope_head_dim dims in adjacent pairs unless `rope_interleave` is false) and GLM-4.5's MoE
(sigmoid scores, e_score_correction_bias for choosing only, n_group / topk_group, renormalised, times
routed_scaling_factor, ungated shared experts), which is DeepSeek-V3's noaux_tc routing: `models.deepseek`'s layer
runs it with the correction bias. What differs is the config: each layer's MLP is dense or sparse by
`mlp_layer_types` (transformers' default: the first layer dense, the rest sparse; it does not read
first_k_dense_replace), Glm4MoeLiteConfig's defaults, and no topk_method / scoring_func to choose. The
multi-token-prediction layer stored after the decoder's (`num_nextn_predict_layers`) is skipped, or drafts with
method "mtp" (`speculative.mtp`).
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.deepseek import (
    KEPT_NULL,
    abstract_layer,
    decoder_layer,
    grouped_fields,
    hf_leaves,
    latent_fields,
)
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.mixtral import moe_fields

ARCHITECTURES = ("Glm4MoeLiteForCausalLM",)
# Glm4MoeLiteConfig's defaults for the fields a config may leave out (or null).
HF_DEFAULTS = dict(moe_intermediate_size=1536, n_shared_experts=1, n_routed_experts=64, routed_scaling_factor=1.8,
                   kv_lora_rank=512, q_lora_rank=768, qk_rope_head_dim=64, v_head_dim=256, qk_nope_head_dim=192,
                   n_group=1, topk_group=1, num_experts_per_tok=4, norm_topk_prob=True, max_position_embeddings=202752,
                   rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1, rope_interleave=True)
MLP_LAYER_TYPES = ("dense", "sparse")
# What the released config names and transformers runs regardless (it reads neither field).
ROUTING = dict(topk_method="noaux_tc", scoring_func="sigmoid")


def dense_layers(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """The layers with a dense MLP: "dense" in mlp_layer_types, by default the first only (as transformers builds
    them; a first_k_dense_replace saying otherwise is refused rather than guessed between)."""
    types = field(hf, "mlp_layer_types", ["dense"] + ["sparse"] * (num_layers - 1))
    if len(types) != num_layers or any(kind not in MLP_LAYER_TYPES for kind in types):
        raise ConfigError(f"mlp_layer_types {types!r} must give one of {list(MLP_LAYER_TYPES)} for each of the "
                          f"{num_layers} layers")
    dense = tuple(i for i, kind in enumerate(types) if kind == "dense")
    first_k = field(hf, "first_k_dense_replace")
    if first_k is not None and dense != tuple(range(min(int(first_k), num_layers))):
        raise ConfigError(f"first_k_dense_replace {first_k} disagrees with the dense layers {list(dense)} "
                          "Glm4MoeLiteForCausalLM runs (mlp_layer_types, by default the first layer only); "
                          "set mlp_layer_types")
    return dense


def _check(hf: Mapping[str, Any], arch: str) -> None:
    """Refuse settings transformers would not run as the checkpoint means them."""
    for name, runs in ROUTING.items():
        if field(hf, name, runs) != runs:
            raise ConfigError(f"{name} {hf[name]!r} is not supported for {arch}: it routes by {runs!r} only")
    params = {**(hf.get("rope_parameters") or {}), **(hf.get("rope_scaling") or {})}
    fraction = params.get("partial_rotary_factor", field(hf, "partial_rotary_factor", 1.0))
    if fraction != 1.0:
        raise ConfigError(f"partial_rotary_factor {fraction} is not supported for {arch}: the rope turns all "
                          "qk_rope_head_dim dims (1.0)")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a GLM-4.7-Flash HF config (fields it leaves out or nulls take Glm4MoeLiteConfig's defaults;
    a null q_lora_rank means a plain q_proj)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None or key in KEPT_NULL}}
    _check(hf, arch)
    fields = common_fields(hf, arch)
    moe = moe_fields(hf, "n_routed_experts", int(hf["moe_intermediate_size"]))
    return ModelConfig(
        **latent_fields(hf, fields, bool(hf["rope_interleave"])),
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
        dense_layers=dense_layers(hf, fields["num_layers"]),
        mtp_layers=int(field(hf, "num_nextn_predict_layers", 0)),
        **grouped_fields(hf, arch, moe),
        **moe,
    )


def _abstract_layer(cfg: ModelConfig, layer: int) -> Any:
    """DeepSeek-V3's layer leaves: the MoE layers hold e_score_correction_bias."""
    return abstract_layer(cfg, layer, correction=True)


def _hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """DeepSeek-V3's tensor names (per-expert experts, as transformers saves them), the correction bias too."""
    return hf_leaves(cfg, correction=True)


FAMILY = Family("glm4_moe_lite", ARCHITECTURES, read_config, _abstract_layer, _hf_leaves, decoder_layer)
