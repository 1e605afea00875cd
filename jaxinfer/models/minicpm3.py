"""OpenBMB's MiniCPM3 (MiniCPM3ForCausalLM: MiniCPM3-4B): DeepSeek-V2's latent attention in a dense, scaled layer.

Attention is multi-head latent attention (`models.latent_attention`, DeepSeek's weights and checkpoint names: a
low-rank query unless q_lora_rank is null, one compressed row cached per token) with rotary embeddings in halves
(rotate-half, not DeepSeek-V2's adjacent pairs) over the qk_rope_head_dim dims, LongRoPE-scaled where the config
says so (Phi-3's reading). The MLP is Llama's gated one in every layer. Granite's scalars carry MiniCPM's muP
scalings (`granite.scaled_residual_layer`, `decoder`): the embeddings times `scale_emb`, each sublayer's output
times scale_depth / sqrt(num_hidden_layers) before its residual add, the logits divided by
hidden_size / dim_model_base. A null scale_depth or dim_model_base scales by 1, as transformers reads them.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import jax

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.deepseek import DeepseekLayerWeights, latent_fields
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.granite import scaled_residual_layer
from jaxinfer.models.latent_attention import latent_attention, latent_attention_hf_leaves, latent_attention_leaves
from jaxinfer.models.mlp import gated_mlp, mlp_hf_leaves, mlp_leaves
from jaxinfer.models.phi3 import check_longrope
from jaxinfer.models.rope import RopeTables
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("MiniCPM3ForCausalLM",)
# MiniCPM3Config's defaults (openbmb/MiniCPM3-4B's values) for the fields a config leaves out.
HF_DEFAULTS = dict(kv_lora_rank=256, q_lora_rank=768, qk_nope_head_dim=64, qk_rope_head_dim=32, scale_emb=12,
                   scale_depth=1.4, dim_model_base=256, max_position_embeddings=32768, rms_norm_eps=1e-5,
                   tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
KEPT_NULL = ("q_lora_rank", "v_head_dim", "scale_depth", "dim_model_base", "bos_token_id", "eos_token_id")


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> DeepseekLayerWeights:
    """One layer's leaves as ArrayInfos: latent attention, then a gated MLP (every layer)."""
    return DeepseekLayerWeights(**latent_attention_leaves(cfg), **mlp_leaves(cfg.hidden_size, cfg.intermediate_size))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives: DeepSeek's attention names, Llama's norms and MLP."""
    D = cfg.hidden_size
    return {
        "attn_norm": HFLeaf("model.layers.{i}.input_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf("model.layers.{i}.post_attention_layernorm.weight", "same", (D,)),
        **latent_attention_hf_leaves(cfg),
        **mlp_hf_leaves(D, cfg.intermediate_size),
    }


def _scalings(hf: Mapping[str, Any], layers: int, hidden: int) -> dict[str, float]:
    """Granite's multipliers from MiniCPM's muP fields (a null scale_depth or dim_model_base: 1)."""
    depth, base = field(hf, "scale_depth", math.sqrt(layers)), field(hf, "dim_model_base", hidden)
    if float(base) <= 0:
        raise ConfigError(f"dim_model_base {base} must be positive (the logits are divided by hidden_size / it)")
    return dict(embedding_multiplier=float(hf["scale_emb"]), residual_multiplier=float(depth) / math.sqrt(layers),
                logits_scaling=hidden / float(base))


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a MiniCPM3 HF config (MLA's bookkeeping as DeepSeek's: one cached row per token)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None or key in KEPT_NULL}}
    hf["v_head_dim"] = field(hf, "v_head_dim", int(hf["hidden_size"]) // int(hf["num_attention_heads"]))
    fields = common_fields(hf, arch, longrope=True)
    if fields["rope_scaling"].rope_type not in ("default", "longrope"):
        raise ConfigError(f"rope type {fields['rope_scaling'].rope_type!r} is not supported for {arch}; "
                          "supported: default, longrope")
    cfg = ModelConfig(
        **latent_fields(hf, fields, interleaved=False),
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
        **_scalings(hf, fields["num_layers"], fields["hidden_size"]),
    )
    check_longrope(cfg)
    return cfg


def decoder_layer(cfg: ModelConfig, x: jax.Array, cache: Any, lw: DeepseekLayerWeights, layer: int,
                  positions: jax.Array, rope: RopeTables) -> tuple[jax.Array, Any]:
    """Latent attention, then the gated MLP, each scaled by residual_multiplier before its residual add."""

    def mlp(h: jax.Array, layout: Layout) -> jax.Array:
        return gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation)

    return scaled_residual_layer(cfg, x, cache, lw, layer, positions, rope, mlp, attention=latent_attention)


FAMILY = Family("minicpm3", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
