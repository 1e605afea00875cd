"""EleutherAI's GPT-J (GPTJForCausalLM: GPT-J-6B and its fine-tunes): Phi's one-norm parallel layer, rotary pairs.

Phi's layer (`models.phi`): one LayerNorm `ln_1` (with a bias) feeds attention and fc_out(gelu_new(fc_in(x)))
side by side, both added to the layer's input (`cfg.parallel_residual`, `mlp_norm` None). q/k/v and `out_proj`
have no biases, the MLP's projections and the untied `lm_head` have them (`cfg.lm_head_bias`). Only the leading
`rotary_dim` of each head's dims rotate, in adjacent pairs (dims 2i and 2i + 1: `cfg.rope_interleaved`, GPT-J's
rotate_every_two), theta 10000; `n_positions` bounds the context. Fields a config leaves out take transformers'
GPTJConfig defaults (rotary_dim 64, n_inner 4 * n_embd).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxinfer.config.generation import token_ids
from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.phi import abstract_layer
from jaxinfer.models.self_attention import attention_hf_leaves
from jaxinfer.models.ungated_mlp import decoder_layer

ARCHITECTURES = ("GPTJForCausalLM",)
REQUIRED = ("vocab_size", "n_embd", "n_layer", "n_head")
PREFIX = "transformer."
# GPTJConfig's defaults for fields a config leaves out.
DEFAULTS = dict(rotary_dim=64, activation_function="gelu_new", layer_norm_epsilon=1e-5, n_positions=2048,
                bos_token_id=50256, eos_token_id=50256, tie_word_embeddings=False)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives: Llama's q/k/v names, `out_proj`, the MLP's `fc_in` / `fc_out`, `ln_1`."""
    D, F = cfg.hidden_size, cfg.intermediate_size
    layer = PREFIX + "h.{i}."
    attn = attention_hf_leaves(cfg, layer + "attn.")
    return {
        **attn,
        "wo": dataclasses.replace(attn["wo"], name=layer + "attn.out_proj.weight"),
        "attn_norm": HFLeaf(layer + "ln_1.weight", "same", (D,)),
        "attn_norm_bias": HFLeaf(layer + "ln_1.bias", "same", (D,)),
        "w_up": HFLeaf(layer + "mlp.fc_in.weight", "transpose", (F, D)),
        "b_up": HFLeaf(layer + "mlp.fc_in.bias", "same", (F,)),
        "w_down": HFLeaf(layer + "mlp.fc_out.weight", "transpose", (D, F)),
        "b_down": HFLeaf(layer + "mlp.fc_out.bias", "same", (D,)),
    }


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a GPT-J HF config (n_embd, n_layer, n_head, n_inner: 4 * n_embd when null)."""
    hf = {**DEFAULTS, **hf}
    D, H = int(hf["n_embd"]), int(hf["n_head"])
    if D % H:
        raise ConfigError(f"n_embd ({D}) must be a multiple of n_head ({H})")
    rotary = hf["rotary_dim"]
    if rotary is None or not 0 < int(rotary) <= D // H or int(rotary) % 2:
        raise ConfigError(f"rotary_dim {rotary!r} is not supported for {arch}: an even number of dims in (0, "
                          f"head_dim {D // H}] (transformers' GPT-J turns the whole model width when null)")
    return ModelConfig(
        architecture=arch, vocab_size=int(hf["vocab_size"]), hidden_size=D,
        intermediate_size=int(field(hf, "n_inner", 4 * D)), num_layers=int(hf["n_layer"]), num_heads=H,
        num_kv_heads=H, head_dim=D // H, rms_norm_eps=float(hf["layer_norm_epsilon"]), layer_norm=True,
        norm_bias=True, mlp_bias=True, parallel_residual=True, lm_head_bias=True, rotary_dim=int(rotary),
        rope_interleaved=True, max_position_embeddings=int(hf["n_positions"]),
        tie_word_embeddings=bool(hf["tie_word_embeddings"]), activation=activation_name(hf["activation_function"]),
        bos_token_id=hf["bos_token_id"], eos_token_ids=token_ids(hf["eos_token_id"]),
    )


FAMILY = Family("gptj", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=(PREFIX + "wte.weight", PREFIX + "ln_f.weight"), required=REQUIRED)
