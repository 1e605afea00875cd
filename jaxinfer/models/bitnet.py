"""Microsoft BitNet b1.58 (BitNetForCausalLM) as transformers runs its unquantized weights: Llama's layer with two
sub-norms and a relu(x)^2 gate.

The layer is Llama's with an RMSNorm over the attention output before `o_proj` (`self_attn.attn_sub_norm`) and
one over the MLP's act(gate) * up before `down_proj` (`mlp.ffn_sub_norm`); the gate's activation is `hidden_act`
(relu2 by default); the rope's base defaults to 500000 (BitNetConfig's). A checkpoint stored ternary
(`quantization_config.quant_method` "bitnet": four 2-bit weights a byte, a scale per tensor, and BitLinear's
per-token int8 activation quantization) is refused by the registry: jaxinfer's int8 is weight-only, so reading
the weights alone would not run the model as it computes (see `registry.REFUSED_QUANTIZATION`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, uniform_windows
from jaxinfer.models.attention import attend
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import linear, linears
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.llama import abstract_layer as llama_layer
from jaxinfer.models.llama import hf_leaves as llama_leaves
from jaxinfer.models.mlp import gate_product
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, project_qkv
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("BitNetForCausalLM",)
# BitNetConfig's defaults for fields a config leaves out.
DEFAULTS = dict(num_key_value_heads=5, rope_theta=500000.0, hidden_act="relu2", rms_norm_eps=1e-5,
                max_position_embeddings=2048, bos_token_id=128000, eos_token_id=128001, tie_word_embeddings=False,
                attention_bias=False)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class BitNetLayerWeights(LayerWeights):
    """Llama's layer and its two sub-norms (None only because the parent's later fields have defaults)."""

    attn_sub_norm: jax.Array | None = None  # [H * K]: the attention output's, before wo
    mlp_sub_norm: jax.Array | None = None  # [F]: act(gate) * up's, before w_down


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> BitNetLayerWeights:
    """Llama's leaves and the sub-norms."""
    base = llama_layer(cfg, layer)
    return BitNetLayerWeights(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                              attn_sub_norm=ArrayInfo((cfg.num_heads * cfg.head_dim,), (None,), init_value=1.0),
                              mlp_sub_norm=ArrayInfo((cfg.intermediate_size,), ("mlp",), init_value=1.0))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Llama's names and the sub-norms'."""
    layer, width = "model.layers.{i}.", cfg.num_heads * cfg.head_dim
    return {**llama_leaves(cfg),
            "attn_sub_norm": HFLeaf(layer + "self_attn.attn_sub_norm.weight", "same", (width,)),
            "mlp_sub_norm": HFLeaf(layer + "mlp.ffn_sub_norm.weight", "same", (cfg.intermediate_size,))}


def attention(cfg: ModelConfig, h: jax.Array, cache: Any, lw: BitNetLayerWeights, layer: int, positions: jax.Array,
              rope: RopeTables) -> tuple[jax.Array, Any]:
    """Llama's attention of the normed h [B, T, D], its output RMS-normed over all heads before wo."""
    q, k, v = project_qkv(h, lw, cfg, rope.for_layer(layer), cache.layout)
    cache = cache.write(layer, k, v, positions)
    out = attend(q, cache, layer, positions, cfg.layer_windows[layer])  # [B, T, H, K]
    normed = rms_norm(out.reshape(*out.shape[:2], -1), lw.attn_sub_norm, cfg.rms_norm_eps).reshape(out.shape)
    return linear(normed, lw.wo, contract=2), cache


def decoder_layer(cfg: ModelConfig, x: jax.Array, cache: Any, lw: BitNetLayerWeights, layer: int,
                  positions: jax.Array, rope: RopeTables) -> tuple[jax.Array, Any]:
    """Pre-norm attention, then the pre-norm gated MLP with its product normed before w_down."""
    layout, eps = cache.layout, cfg.rms_norm_eps
    out, cache = attention(cfg, rms_norm(x, lw.attn_norm, eps), cache, lw, layer, positions, rope)
    x = layout.constrain(x + out, HIDDEN)
    gate, up = linears(rms_norm(x, lw.mlp_norm, eps), [lw.w_gate, lw.w_up])
    h = linear(rms_norm(gate_product(cfg.activation, gate, up), lw.mlp_sub_norm, eps), lw.w_down)
    return layout.constrain(x + h, HIDDEN), cache


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a BitNet HF config (its attention output normed at hidden_size: heads * head_dim must be it)."""
    hf = {**DEFAULTS, **hf}
    if hf["attention_bias"]:
        raise ConfigError(f"attention_bias=True is not supported for {arch} (no released BitNet uses it)")
    fields = common_fields(hf, arch)
    if fields["num_heads"] * fields["head_dim"] != fields["hidden_size"]:
        raise ConfigError(f"head_dim {fields['head_dim']} is not supported for {arch}: attn_sub_norm spans "
                          f"hidden_size ({fields['hidden_size']}), so num_attention_heads * head_dim must equal it")
    return ModelConfig(
        **fields,
        activation=activation_name(hf["hidden_act"] or "relu2"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
    )


FAMILY = Family("bitnet", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
