"""Stability AI's StableLM (StableLmForCausalLM: StableLM-3B-4E1T, StableLM 2 1.6B / 12B, StableCode): LayerNorms
around Llama's gated MLP.

`models.ungated_mlp`'s layer (`norm_layer`) with Llama's gated SiLU MLP down(silu(gate(x)) * up(x)), no MLP
biases: LayerNorms with biases (`layer_norm_eps`; the final `model.norm` too), only the leading
`partial_rotary_factor` of each head's dims rotated (0.25 by default, halves as Llama's). Under
`use_parallel_residual` (StableLM 2 12B) one `input_layernorm` feeds attention and the MLP side by side
(`mlp_norm` None); otherwise they run one after the other, the MLP behind `post_attention_layernorm`.
`use_qkv_bias` biases q/k/v (never o_proj); `qk_layernorm` norms q and k per head with bias-free LayerNorms
holding a weight per head and dim (Cohere's q/k norms), stored one module per head (`norms.{h}`) and stacked at
load. Fields a config leaves out take transformers' StableLmConfig defaults (32 KV heads, untied head).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.config.model import ModelConfig, activation_name, common_fields, uniform_windows
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import Weight
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.phi3 import partial_rotary_dims
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.ungated_mlp import UngatedLayerWeights, norm_layer
from jaxinfer.models.ungated_mlp import abstract_layer as ungated_layer
from jaxinfer.models.ungated_mlp import hf_leaves as ungated_hf_leaves
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("StableLmForCausalLM",)
# StableLmConfig's defaults for fields a config leaves out.
DEFAULTS = dict(num_key_value_heads=32, hidden_act="silu", max_position_embeddings=4096, layer_norm_eps=1e-5,
                tie_word_embeddings=False, use_qkv_bias=False, qk_layernorm=False, use_parallel_residual=False,
                bos_token_id=0, eos_token_id=0)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class GatedNormLayerWeights(UngatedLayerWeights):
    """The ungated layer's leaves and a gate: Llama's MLP behind LayerNorms."""

    w_gate: Weight | None = None  # [D, F]

    PROJECTIONS: ClassVar[dict[str, int]] = LayerWeights.PROJECTIONS
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = LayerWeights.JOINED


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> GatedNormLayerWeights:
    """One layer's leaves as ArrayInfos: the ungated layer's and `w_gate`, no MLP norm under the parallel residual."""
    base = vars(ungated_layer(cfg, layer))
    if cfg.parallel_residual:
        base = {**base, "mlp_norm": None, "mlp_norm_bias": None}
    return GatedNormLayerWeights(**base, w_gate=ArrayInfo((cfg.hidden_size, cfg.intermediate_size), ("embed", "mlp")))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives: Llama's names, the q/k norms' one tensor per head stacked."""
    H, KV, K, D, F = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
    leaves = ungated_hf_leaves(cfg)
    leaves["w_gate"] = HFLeaf("model.layers.{i}.mlp.gate_proj.weight", "transpose", (F, D))
    if cfg.parallel_residual:
        del leaves["mlp_norm"], leaves["mlp_norm_bias"]
    if cfg.qk_norm:
        attn = "model.layers.{i}.self_attn."
        leaves["q_norm"] = HFLeaf(attn + "q_layernorm.norms.{e}.weight", "same", (K,), experts=H)
        leaves["k_norm"] = HFLeaf(attn + "k_layernorm.norms.{e}.weight", "same", (K,), experts=KV)
    return leaves


def gated(h: jax.Array, lw: GatedNormLayerWeights, act: str) -> jax.Array:
    """Llama's gated MLP of the normed input."""
    return gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, act)


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: GatedNormLayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """The ungated layer's residual structure around the gated MLP."""
    return norm_layer(cfg, x, cache, lw, layer, positions, rope, gated)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a StableLM HF config (transformers 4's top-level partial_rotary_factor, or 5's
    rope_parameters)."""
    hf = {**DEFAULTS, **hf}
    fields = common_fields(hf, arch)
    return ModelConfig(
        **{**fields, "rms_norm_eps": float(hf["layer_norm_eps"])},
        layer_norm=True,
        norm_bias=True,
        qkv_bias=bool(hf["use_qkv_bias"]),
        qk_norm=bool(hf["qk_layernorm"]),
        parallel_residual=bool(hf["use_parallel_residual"]),
        rotary_dim=partial_rotary_dims(hf, fields["head_dim"], 0.25),
        activation=activation_name(hf["hidden_act"]),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
    )


FAMILY = Family("stablelm", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
