"""TII's Falcon (FalconForCausalLM: Falcon-7B, -40B, -180B and their instruct models): the ungated layer in its
three arrangements over grouped K/V heads, with rotary embeddings.

`models.ungated_mlp`'s layer: LayerNorms with biases (`layer_norm_epsilon`; the final `ln_f` too) and the MLP
dense_4h_to_h(gelu(dense_h_to_4h(x))) (`ffn_hidden_size`, 4 * hidden_size when null), no projection biases.
- `new_decoder_architecture` (Falcon-40B, -180B): attention and the MLP in parallel, each off its own norm
  `ln_attn` / `ln_mlp` (GPT-NeoX's form), or both off `input_layernorm` when `num_ln_in_parallel_attn` is 1;
  `num_kv_heads` K/V heads.
- otherwise `parallel_attn` (Falcon-7B): one `input_layernorm` feeds both side by side (Phi's form,
  `cfg.one_norm`); without it attention, then the MLP behind `post_attention_layernorm`. One K/V head under
  `multi_query` (the default), else one per head.
Either way `query_key_value` holds, for each K/V group, its query heads' rows, then its key's, then its value's
(one group for multi-query: all q, then k, then v; a group per head without it: [heads, 3, head_dim]), read as
wq (`HFLeaf` kind `in_group_rows`), wk and wv at load. Every head's dims rotate (rotate-half,
`rope_parameters`); the head is tied by default. Under `alibi` (Falcon-RW) nothing rotates: each head's scores take
ALiBi's bias with BLOOM's slopes, rounded to bfloat16 and scaled by 1/sqrt(head_dim) as transformers' Falcon adds
them before the scale (it also rounds each slope * position to bfloat16, which here stays exact: the two agree up
to position 256, past it the products differ by that rounding). `bias` (Falcon-RW) biases query_key_value (where
the K/V groups are one or one per head), dense and the MLP. Refused by name: `bias` over other groupings, and the
forms transformers' own Falcon cannot run (a new-architecture layer without `parallel_attn`,
`num_ln_in_parallel_attn` other than 1 or 2).
"""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.models.alibi import bloom_slopes
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.phi import abstract_layer as one_norm_layer
from jaxinfer.models.ungated_mlp import UngatedLayerWeights, decoder_layer
from jaxinfer.models.ungated_mlp import abstract_layer as two_norm_layer

ARCHITECTURES = ("FalconForCausalLM",)
REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
PREFIX = "transformer."
# FalconConfig's defaults for fields a config leaves out.
DEFAULTS = dict(layer_norm_epsilon=1e-5, alibi=False, new_decoder_architecture=False, multi_query=True,
                parallel_attn=True, bias=False, max_position_embeddings=2048, bos_token_id=11, eos_token_id=11,
                activation="gelu", tie_word_embeddings=True)


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> UngatedLayerWeights:
    """One layer's leaves as ArrayInfos: without an MLP norm where one norm feeds both (Phi's)."""
    return one_norm_layer(cfg, layer) if cfg.one_norm else two_norm_layer(cfg, layer)


def _norms(cfg: ModelConfig) -> dict[str, str]:
    """Layer field -> the LayerNorm module it reads."""
    if cfg.one_norm:
        return {"attn_norm": "input_layernorm."}
    if cfg.parallel_residual:
        return {"attn_norm": "ln_attn.", "mlp_norm": "ln_mlp."}
    return {"attn_norm": "input_layernorm.", "mlp_norm": "post_attention_layernorm."}


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives: q/k/v as each K/V group's rows of `query_key_value`."""
    H, KV, K, D, F = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
    layer = PREFIX + "h.{i}."
    qkv = (layer + "self_attention.query_key_value.weight", ((H + 2 * KV) * K, D))
    leaves = {
        "wq": HFLeaf(qkv[0], "in_group_rows", qkv[1], H, K, groups=KV),
        "wk": HFLeaf(qkv[0], "in_head_rows", qkv[1], KV, K, row_offset=cfg.q_per_kv * K),
        "wv": HFLeaf(qkv[0], "in_head_rows", qkv[1], KV, K, row_offset=(cfg.q_per_kv + 1) * K),
        "wo": HFLeaf(layer + "self_attention.dense.weight", "out_heads", (D, H * K), H, K),
        "w_up": HFLeaf(layer + "mlp.dense_h_to_4h.weight", "transpose", (F, D)),
        "w_down": HFLeaf(layer + "mlp.dense_4h_to_h.weight", "transpose", (D, F)),
    }
    for field_name, norm in _norms(cfg).items():
        leaves[field_name] = HFLeaf(layer + norm + "weight", "same", (D,))
        leaves[field_name + "_bias"] = HFLeaf(layer + norm + "bias", "same", (D,))
    if cfg.qkv_bias:  # Falcon-RW
        leaves |= _qkv_biases(cfg, layer + "self_attention.query_key_value.bias")
        leaves |= {"bo": HFLeaf(layer + "self_attention.dense.bias", "same", (D,)),
                   "b_up": HFLeaf(layer + "mlp.dense_h_to_4h.bias", "same", (F,)),
                   "b_down": HFLeaf(layer + "mlp.dense_4h_to_h.bias", "same", (D,))}
    return leaves


def _qkv_biases(cfg: ModelConfig, name: str) -> dict[str, HFLeaf]:
    """q/k/v biases of `query_key_value` laid out as its rows: one K/V group (all q, then k, then v) or one per head
    ([heads, 3, head_dim]); `_refuse` turns other groupings away."""
    H, KV, K = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    shape = ((H + 2 * KV) * K,)
    if KV == 1:
        return {"bq": HFLeaf(name, "bias_heads", shape, H, K), "bk": HFLeaf(name, "bias_heads", shape, 1, K, H * K),
                "bv": HFLeaf(name, "bias_heads", shape, 1, K, (H + 1) * K)}
    return {f"b{p}": HFLeaf(name, "bias_head_rows", shape, H, K, row_offset=i * K) for i, p in enumerate("qkv")}


def _refuse(hf: Mapping[str, Any], arch: str) -> None:
    """ConfigError naming the first setting not run."""
    new = bool(hf["new_decoder_architecture"])
    if hf["bias"] and new and int(field(hf, "num_kv_heads", 1)) not in (1, int(hf["num_attention_heads"])):
        raise ConfigError(f"bias=True is not supported for {arch} with {hf['num_kv_heads']} K/V groups of several "
                          "heads; supported: one K/V head, or one per head (Falcon-RW)")
    if new and not hf["parallel_attn"]:
        raise ConfigError(f"parallel_attn=False is not supported for {arch} with new_decoder_architecture "
                          "(transformers' Falcon cannot run it either); supported: true")
    if new and int(field(hf, "num_ln_in_parallel_attn", 2)) not in (1, 2):
        raise ConfigError(f"num_ln_in_parallel_attn {hf['num_ln_in_parallel_attn']} is not supported for {arch}; "
                          "supported: 1, 2 (null: 2)")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Falcon HF config (num_kv_heads read by the new architecture only, as transformers does)."""
    hf = {**DEFAULTS, **hf}
    _refuse(hf, arch)
    H, D = int(hf["num_attention_heads"]), int(hf["hidden_size"])
    new = bool(hf["new_decoder_architecture"])
    kv = int(field(hf, "num_kv_heads", H)) if new else 1 if hf["multi_query"] else H
    ffn = int(field(hf, "ffn_hidden_size", 4 * D))
    fields = common_fields({**hf, "intermediate_size": ffn, "num_key_value_heads": kv, "head_dim": None}, arch)
    parallel = new or bool(hf["parallel_attn"])
    bias, alibi = bool(hf["bias"]), bool(hf["alibi"])
    return ModelConfig(
        **{**fields, "rms_norm_eps": float(hf["layer_norm_epsilon"])},
        layer_norm=True,
        norm_bias=True,
        parallel_residual=parallel,
        one_norm=parallel and not (new and int(field(hf, "num_ln_in_parallel_attn", 2)) == 2),
        activation=activation_name(hf["activation"]),
        qkv_bias=bias, o_bias=bias, mlp_bias=bias,
        nope_layers=tuple(range(fields["num_layers"])) if alibi else (),
        alibi_slopes=_alibi_slopes(fields["num_heads"], fields["head_dim"]) if alibi else (),
    )


def _alibi_slopes(heads: int, head_dim: int) -> tuple[float, ...]:
    """transformers' Falcon ALiBi: BLOOM's slopes rounded to bfloat16, added before the 1/sqrt(head_dim) scale."""
    rounded = np.asarray(jnp.asarray(bloom_slopes(heads), jnp.bfloat16).astype(jnp.float32))
    return tuple(float(s) * head_dim**-0.5 for s in rounded)


FAMILY = Family("falcon", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=(PREFIX + "word_embeddings.weight", PREFIX + "ln_f.weight"), required=REQUIRED)
