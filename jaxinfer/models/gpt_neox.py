"""EleutherAI's GPT-NeoX (GPTNeoXForCausalLM: Pythia, GPT-NeoX-20B): the ungated layer, its residual in parallel.

`models.ungated_mlp`'s layer: LayerNorms with biases, biased projections and the GELU MLP
dense_4h_to_h(gelu(dense_h_to_4h(x))). With `use_parallel_residual` (the default, every Pythia's)
attention and the MLP each read the layer's input through their own norm and are added to it together
(`cfg.parallel_residual`); without it they run one after the other. q, k and v share one
`query_key_value` projection laid out per head ([heads, 3, head_dim]: each head's q rows, then its k
rows, then its v rows), read as three at load. Only the leading `rotary_pct` of each head's dims rotate
(`cfg.rotary_dim`, halves as Llama's); the output head `embed_out` is untied. Fields a config leaves out take
transformers' GPTNeoXConfig defaults (rotary_pct 0.25, exact GELU); num_key_value_heads is not read (every
head has its own keys, as transformers has them).
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ModelConfig, activation_name, common_fields, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.phi3 import partial_rotary_dims
from jaxinfer.models.ungated_mlp import abstract_layer, decoder_layer

ARCHITECTURES = ("GPTNeoXForCausalLM",)
# GPTNeoXConfig's defaults for fields a config leaves out.
DEFAULTS = dict(hidden_act="gelu", layer_norm_eps=1e-5, max_position_embeddings=2048, bos_token_id=0, eos_token_id=2,
                tie_word_embeddings=False, use_parallel_residual=True, attention_bias=True)
PREFIX = "gpt_neox."


def hf_leaves(cfg: ModelConfig, layer: str = PREFIX + "layers.{i}.",
              attention: str = "attention.") -> dict[str, HFLeaf]:
    """Where each layer field lives: q/k/v as each head's rows of the fused `query_key_value` (under `layer` +
    `attention`: Persimmon's `model.layers.{i}.self_attn.`)."""
    H, K, D, F = cfg.num_heads, cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
    qkv = layer + attention + "query_key_value."
    leaves = {
        **{f"w{p}": HFLeaf(qkv + "weight", "in_head_rows", (3 * H * K, D), H, K, row_offset=i * K)
           for i, p in enumerate("qkv")},
        "wo": HFLeaf(layer + attention + "dense.weight", "out_heads", (D, H * K), H, K),
        "w_up": HFLeaf(layer + "mlp.dense_h_to_4h.weight", "transpose", (F, D)),
        "b_up": HFLeaf(layer + "mlp.dense_h_to_4h.bias", "same", (F,)),
        "w_down": HFLeaf(layer + "mlp.dense_4h_to_h.weight", "transpose", (D, F)),
        "b_down": HFLeaf(layer + "mlp.dense_4h_to_h.bias", "same", (D,)),
    }
    for field_name, norm in (("attn_norm", "input_layernorm."), ("mlp_norm", "post_attention_layernorm.")):
        leaves[field_name] = HFLeaf(layer + norm + "weight", "same", (D,))
        leaves[field_name + "_bias"] = HFLeaf(layer + norm + "bias", "same", (D,))
    if cfg.qkv_bias:
        leaves |= {f"b{p}": HFLeaf(qkv + "bias", "bias_head_rows", (3 * H * K,), H, K, row_offset=i * K)
                   for i, p in enumerate("qkv")}
        leaves["bo"] = HFLeaf(layer + attention + "dense.bias", "same", (D,))
    return leaves


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a GPT-NeoX HF config (transformers 4's rotary_pct / rotary_emb_base, or 5's rope_parameters)."""
    hf = {**DEFAULTS, "rope_theta": field(hf, "rotary_emb_base", 10000.0), **hf}
    fields = common_fields(hf, arch)
    bias = bool(hf["attention_bias"])
    return ModelConfig(
        **{**fields, "num_kv_heads": fields["num_heads"], "rms_norm_eps": float(hf["layer_norm_eps"])},
        layer_norm=True,
        norm_bias=True,
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=True,
        parallel_residual=bool(hf["use_parallel_residual"]),
        rotary_dim=partial_rotary_dims(hf, fields["head_dim"], float(field(hf, "rotary_pct", 0.25))),
        activation=activation_name(hf["hidden_act"] or "gelu"),
    )


FAMILY = Family("gpt_neox", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=(PREFIX + "embed_in.weight", PREFIX + "final_layer_norm.weight"), head_name="embed_out")
