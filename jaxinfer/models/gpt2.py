"""OpenAI's GPT-2 and DistilGPT-2 (GPT2LMHeadModel): learned positions, Conv1D weights, the ungated pre-norm layer.

`models.ungated_mlp`'s sequential layer: ln_1, attention, ln_2, c_proj(gelu_new(c_fc(x))), LayerNorms and every
projection with biases. Positions are learned: `wpe` [n_positions, D] is a table whose row at each token's
position joins its embedding (`cfg.learned_positions`, a gather: positions are data in the steps), and no rotary
embedding turns (every layer is in `cfg.nope_layers`). The table bounds the context: max_seq_len may not pass
n_positions (checked at load), so a longer request is refused before it runs. Conv1D stores weights [in, out]:
`c_attn` [D, 3D] holds q, then k, then v columns (each head's contiguous), read as three at load. The output
head is tied to `wte`. `scale_attn_weights` false drops the 1/sqrt(head_dim) scale; `reorder_and_upcast_attn` is
read and nothing changes (the scores here are float32 already); `scale_attn_by_inverse_layer_idx` and
`add_cross_attention` are refused.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.generation import token_ids
from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.ungated_mlp import abstract_layer, decoder_layer

ARCHITECTURES = ("GPT2LMHeadModel",)
REQUIRED = ("vocab_size", "n_embd", "n_layer", "n_head")
PREFIX = "transformer."
# GPT2Config's defaults for fields a config leaves out.
DEFAULTS = dict(activation_function="gelu_new", layer_norm_epsilon=1e-5, n_positions=1024, bos_token_id=50256,
                eos_token_id=50256, tie_word_embeddings=True, scale_attn_weights=True,
                scale_attn_by_inverse_layer_idx=False, add_cross_attention=False)
# Settings whose True is not run, with why.
REFUSED = {
    "scale_attn_by_inverse_layer_idx": "its scores scaled by 1 / (layer + 1) in each layer",
    "add_cross_attention": "cross-attention to an encoder's states (an encoder-decoder's half)",
}


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives: Conv1D weights as stored [in, out]; q/k/v as column blocks of c_attn."""
    H, K, D = cfg.num_heads, cfg.head_dim, cfg.hidden_size
    qkv = PREFIX + "h.{i}.attn.c_attn."
    return {
        **{f"w{p}": HFLeaf(qkv + "weight", "in_head_columns", (D, 3 * H * K), H, K, row_offset=i * H * K)
           for i, p in enumerate("qkv")},
        **{f"b{p}": HFLeaf(qkv + "bias", "bias_heads", (3 * H * K,), H, K, row_offset=i * H * K)
           for i, p in enumerate("qkv")},
        **body_leaves(cfg, conv1d=True),
    }


def body_leaves(cfg: ModelConfig, conv1d: bool) -> dict[str, HFLeaf]:
    """A GPT-2-named layer's fields past q/k/v: c_proj, the MLP's c_fc / c_proj and ln_1 / ln_2, with biases.
    conv1d: GPT-2's Conv1D weights, stored [in, out]; else torch Linear's [out, in] (GPTBigCode)."""
    H, K, D, F = cfg.num_heads, cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
    layer = PREFIX + "h.{i}."
    if conv1d:
        wo = HFLeaf(layer + "attn.c_proj.weight", "head_rows", (H * K, D), H, K)
        w_up = HFLeaf(layer + "mlp.c_fc.weight", "same", (D, F))
        w_down = HFLeaf(layer + "mlp.c_proj.weight", "same", (F, D))
    else:
        wo = HFLeaf(layer + "attn.c_proj.weight", "out_heads", (D, H * K), H, K)
        w_up = HFLeaf(layer + "mlp.c_fc.weight", "transpose", (F, D))
        w_down = HFLeaf(layer + "mlp.c_proj.weight", "transpose", (D, F))
    leaves = {
        "wo": wo,
        "bo": HFLeaf(layer + "attn.c_proj.bias", "same", (D,)),
        "w_up": w_up,
        "b_up": HFLeaf(layer + "mlp.c_fc.bias", "same", (F,)),
        "w_down": w_down,
        "b_down": HFLeaf(layer + "mlp.c_proj.bias", "same", (D,)),
    }
    for field_name, norm in (("attn_norm", "ln_1."), ("mlp_norm", "ln_2.")):
        leaves[field_name] = HFLeaf(layer + norm + "weight", "same", (D,))
        leaves[field_name + "_bias"] = HFLeaf(layer + norm + "bias", "same", (D,))
    return leaves


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a GPT-2 HF config (n_embd, n_layer, n_head, n_inner: 4 * n_embd when null)."""
    hf = {**DEFAULTS, **hf}
    for name, what in REFUSED.items():
        if hf[name]:
            raise ConfigError(f"{name}=True is not supported for {arch} ({what}); supported: false, every "
                              "release's (GPT-2's, GPTBigCode's)")
    D, H, layers = int(hf["n_embd"]), int(hf["n_head"]), int(hf["n_layer"])
    if D % H:
        raise ConfigError(f"n_embd ({D}) must be a multiple of n_head ({H})")
    return ModelConfig(
        architecture=arch, vocab_size=int(hf["vocab_size"]), hidden_size=D,
        intermediate_size=int(field(hf, "n_inner", 4 * D)), num_layers=layers, num_heads=H, num_kv_heads=H,
        head_dim=D // H, rms_norm_eps=float(hf["layer_norm_epsilon"]), layer_norm=True, norm_bias=True,
        qkv_bias=True, o_bias=True, mlp_bias=True, max_position_embeddings=int(hf["n_positions"]),
        tie_word_embeddings=bool(hf["tie_word_embeddings"]), activation=activation_name(hf["activation_function"]),
        attn_scale=None if hf["scale_attn_weights"] else 1.0, nope_layers=tuple(range(layers)),
        learned_positions=True, bos_token_id=hf["bos_token_id"], eos_token_ids=token_ids(hf["eos_token_id"]),
    )


FAMILY = Family("gpt2", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=(PREFIX + "wte.weight", PREFIX + "ln_f.weight"), positions_name=PREFIX + "wpe.weight",
                required=REQUIRED)
