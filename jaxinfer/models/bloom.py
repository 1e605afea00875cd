"""BigScience's BLOOM (BloomForCausalLM: bloom-560m to bloom-176b, bloomz): ALiBi attention in the ungated layer.

`models.ungated_mlp`'s sequential layer: input_layernorm, attention, post_attention_layernorm, then
dense_4h_to_h(gelu_tanh(dense_h_to_4h(x))); LayerNorms and every projection with biases. No position embedding:
each head's scores take ALiBi's bias (`cfg.alibi_slopes`, BLOOM's rule in `alibi.bloom_slopes`) and no rotary
embedding turns (every layer in `cfg.nope_layers`). The embeddings pass `word_embeddings_layernorm` before the first
layer: layer 0 holds it (`embed_norm`, read by `layer_hf_leaves`), so the shared decoder is unchanged.
`query_key_value` is laid out per head ([heads, 3, head_dim]: each head's q, k, v rows, as GPT-NeoX's), read as
three at load. The head is tied to the embedding. Refused by name: `apply_residual_connection_post_layernorm`
(its residual is the normed input; no released checkpoint sets it). `pretraining_tp` and `slow_but_exact` only
split transformers' output projection into slices and are read as no change.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax

from jaxinfer.config.generation import token_ids
from jaxinfer.config.model import ConfigError, ModelConfig
from jaxinfer.models.alibi import bloom_slopes
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.norms import layer_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.ungated_mlp import UngatedLayerWeights
from jaxinfer.models.ungated_mlp import abstract_layer as ungated_layer
from jaxinfer.models.ungated_mlp import decoder_layer as ungated_decoder_layer
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("BloomForCausalLM",)
REQUIRED = ("vocab_size", "n_layer", "n_head")
PREFIX = "transformer."
# BloomConfig's defaults for fields a config leaves out.
DEFAULTS = dict(layer_norm_epsilon=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
                apply_residual_connection_post_layernorm=False)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class BloomLayerWeights(UngatedLayerWeights):
    """The ungated layer; layer 0 also holds the embeddings' LayerNorm (None on the others)."""

    embed_norm: jax.Array | None = None  # [D]
    embed_norm_bias: jax.Array | None = None  # [D]


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> BloomLayerWeights:
    """One layer's leaves as ArrayInfos: the ungated layer's, with the embeddings' LayerNorm on layer 0."""
    fields = {f.name: getattr(ungated_layer(cfg, layer), f.name) for f in dataclasses.fields(UngatedLayerWeights)}
    if layer == 0:
        D = cfg.hidden_size
        fields.update(embed_norm=ArrayInfo((D,), ("embed",), init_value=1.0),
                      embed_norm_bias=ArrayInfo((D,), ("embed",)))
    return BloomLayerWeights(**fields)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives: q/k/v as each head's rows of the fused `query_key_value`."""
    H, K, D, F = cfg.num_heads, cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
    layer = PREFIX + "h.{i}."
    qkv = layer + "self_attention.query_key_value."
    leaves = {
        **{f"w{p}": HFLeaf(qkv + "weight", "in_head_rows", (3 * H * K, D), H, K, row_offset=i * K)
           for i, p in enumerate("qkv")},
        **{f"b{p}": HFLeaf(qkv + "bias", "bias_head_rows", (3 * H * K,), H, K, row_offset=i * K)
           for i, p in enumerate("qkv")},
        "wo": HFLeaf(layer + "self_attention.dense.weight", "out_heads", (D, H * K), H, K),
        "bo": HFLeaf(layer + "self_attention.dense.bias", "same", (D,)),
        "w_up": HFLeaf(layer + "mlp.dense_h_to_4h.weight", "transpose", (F, D)),
        "b_up": HFLeaf(layer + "mlp.dense_h_to_4h.bias", "same", (F,)),
        "w_down": HFLeaf(layer + "mlp.dense_4h_to_h.weight", "transpose", (D, F)),
        "b_down": HFLeaf(layer + "mlp.dense_4h_to_h.bias", "same", (D,)),
    }
    for field_name, norm in (("attn_norm", "input_layernorm."), ("mlp_norm", "post_attention_layernorm.")):
        leaves[field_name] = HFLeaf(layer + norm + "weight", "same", (D,))
        leaves[field_name + "_bias"] = HFLeaf(layer + norm + "bias", "same", (D,))
    return leaves


def layer_hf_leaves(cfg: ModelConfig, layer: int) -> dict[str, HFLeaf]:
    """Layer 0's own tensors: the embeddings' LayerNorm."""
    if layer:
        return {}
    norm, D = PREFIX + "word_embeddings_layernorm.", cfg.hidden_size
    return {"embed_norm": HFLeaf(norm + "weight", "same", (D,)), "embed_norm_bias": HFLeaf(norm + "bias", "same", (D,))}


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: BloomLayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """The ungated layer, the embeddings normed first on layer 0 (the residual stream starts from them normed)."""
    if lw.embed_norm is not None:
        x = layer_norm(x, lw.embed_norm, cfg.rms_norm_eps, lw.embed_norm_bias)
    return ungated_decoder_layer(cfg, x, cache, lw, layer, positions, rope)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a BLOOM HF config (hidden_size, or n_embed as older configs name it; n_layer, n_head)."""
    hf = {**DEFAULTS, **hf}
    if hf["apply_residual_connection_post_layernorm"]:
        raise ConfigError(f"apply_residual_connection_post_layernorm=True is not supported for {arch} (its residual "
                          "is the normed input; no released BLOOM sets it); supported: false")
    if hf.get("hidden_size", hf.get("n_embed")) is None:
        raise ConfigError(f"{arch} config sets neither hidden_size nor n_embed")
    D, H, layers = int(hf.get("hidden_size", hf.get("n_embed"))), int(hf["n_head"]), int(hf["n_layer"])
    if D % H:
        raise ConfigError(f"hidden_size ({D}) must be a multiple of n_head ({H})")
    return ModelConfig(
        architecture=arch, vocab_size=int(hf["vocab_size"]), hidden_size=D, intermediate_size=4 * D,
        num_layers=layers, num_heads=H, num_kv_heads=H, head_dim=D // H, rms_norm_eps=float(hf["layer_norm_epsilon"]),
        layer_norm=True, norm_bias=True, qkv_bias=True, o_bias=True, mlp_bias=True, max_position_embeddings=2048,
        tie_word_embeddings=bool(hf["tie_word_embeddings"]), activation="gelu_tanh", nope_layers=tuple(range(layers)),
        alibi_slopes=bloom_slopes(H), bos_token_id=hf["bos_token_id"], eos_token_ids=token_ids(hf["eos_token_id"]),
    )


FAMILY = Family("bloom", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=(PREFIX + "word_embeddings.weight", PREFIX + "ln_f.weight"), required=REQUIRED,
                layer_hf_leaves=layer_hf_leaves)
