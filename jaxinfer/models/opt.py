"""Meta's OPT (OPTForCausalLM: OPT-125M to 66B, Galactica): GPT-2's learned positions from row 2, a ReLU MLP.

`models.ungated_mlp`'s sequential pre-norm layer: self_attn_layer_norm, attention, final_layer_norm,
fc2(relu(fc1(x))), LayerNorms with biases and every projection biased under `enable_bias`. Positions are
learned as GPT-2's (`cfg.learned_positions`, gathered by each token's position), but OPT's table
`embed_positions` [max_position_embeddings + 2, D] leaves its first two rows unused: position p reads row
p + 2 (`cfg.position_offset`). No rotary embedding turns; the output head is tied to `embed_tokens`.
OPT-350M's two differences: `do_layer_norm_before` false norms each sublayer's sum, LN(x + f(x)), not its input,
and builds no final LayerNorm (`cfg.post_norm`); `word_embed_proj_dim` 512 below hidden_size 1024 makes the
embeddings (and the tied head) that wide, `project_in` taking them to hidden_size before the positions are added
and `project_out` taking the last layer's output back (`cfg.word_embed_proj_dim`, `decoder.final_hidden`).
Refused by name: `_remove_final_layer_norm` and `layer_norm_elementwise_affine` false (LayerNorms without weights).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax

from jaxinfer.config.generation import token_ids
from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.norms import config_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, attention_hf_leaves, self_attention
from jaxinfer.models.ungated_mlp import UngatedLayerWeights, abstract_layer, ungated_mlp
from jaxinfer.models.ungated_mlp import decoder_layer as pre_norm_layer

ARCHITECTURES = ("OPTForCausalLM",)
REQUIRED = ("vocab_size", "hidden_size", "ffn_dim", "num_hidden_layers", "num_attention_heads")
PREFIX = "model.decoder."
POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding's offset
# OPTConfig's defaults for fields a config leaves out.
DEFAULTS = dict(activation_function="relu", max_position_embeddings=2048, do_layer_norm_before=True,
                _remove_final_layer_norm=False, enable_bias=True, layer_norm_elementwise_affine=True, bos_token_id=2,
                eos_token_id=2, tie_word_embeddings=True)
# Settings whose value here is not run: (the value run, what the other means).
REFUSED = {
    "_remove_final_layer_norm": (False, "no final LayerNorm"),
    "layer_norm_elementwise_affine": (True, "LayerNorms without weights or biases"),
}


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives: Llama's q/k/v names, `out_proj`, the MLP's `fc1` / `fc2`, its two norms."""
    D, F = cfg.hidden_size, cfg.intermediate_size
    layer = PREFIX + "layers.{i}."
    attn = attention_hf_leaves(dataclasses.replace(cfg, o_bias=False), layer + "self_attn.")
    leaves = {
        **attn,
        "wo": dataclasses.replace(attn["wo"], name=layer + "self_attn.out_proj.weight"),
        "w_up": HFLeaf(layer + "fc1.weight", "transpose", (F, D)),
        "w_down": HFLeaf(layer + "fc2.weight", "transpose", (D, F)),
    }
    for field_name, norm in (("attn_norm", "self_attn_layer_norm."), ("mlp_norm", "final_layer_norm.")):
        leaves[field_name] = HFLeaf(layer + norm + "weight", "same", (D,))
        leaves[field_name + "_bias"] = HFLeaf(layer + norm + "bias", "same", (D,))
    if cfg.mlp_bias:
        leaves |= {"b_up": HFLeaf(layer + "fc1.bias", "same", (F,)), "b_down": HFLeaf(layer + "fc2.bias", "same", (D,)),
                   "bo": HFLeaf(layer + "self_attn.out_proj.bias", "same", (D,))}
    return leaves


def _activation(name: str) -> str:
    """OPT's ReLU (ours alone: other families' configs naming relu stay refused), else the shared names."""
    return "relu" if name == "relu" else activation_name(name)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an OPT HF config (ffn_dim the MLP's width)."""
    hf = {**DEFAULTS, **hf}
    for name, (runs, what) in REFUSED.items():
        if bool(hf[name]) != runs:
            raise ConfigError(f"{name}={hf[name]} is not supported for {arch} ({what}); supported: {runs}")
    D, H, layers = int(hf["hidden_size"]), int(hf["num_attention_heads"]), int(hf["num_hidden_layers"])
    projected = int(field(hf, "word_embed_proj_dim", D))
    if projected <= 0:
        raise ConfigError(f"word_embed_proj_dim {projected} is not supported for {arch}; supported: a positive "
                          "width (hidden_size, or OPT-350M's narrower embeddings)")
    if D % H:
        raise ConfigError(f"hidden_size ({D}) must be a multiple of num_attention_heads ({H})")
    bias = bool(hf["enable_bias"])
    return ModelConfig(
        architecture=arch, vocab_size=int(hf["vocab_size"]), hidden_size=D, intermediate_size=int(hf["ffn_dim"]),
        num_layers=layers, num_heads=H, num_kv_heads=H, head_dim=D // H, rms_norm_eps=1e-5, layer_norm=True,
        norm_bias=True, qkv_bias=bias, o_bias=bias, mlp_bias=bias,
        max_position_embeddings=int(hf["max_position_embeddings"]), tie_word_embeddings=bool(hf["tie_word_embeddings"]),
        activation=_activation(hf["activation_function"]), nope_layers=tuple(range(layers)), learned_positions=True,
        position_offset=POSITION_OFFSET, post_norm=not hf["do_layer_norm_before"],
        word_embed_proj_dim=0 if projected == D else projected, bos_token_id=hf["bos_token_id"],
        eos_token_ids=token_ids(hf["eos_token_id"]),
    )


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: UngatedLayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """OPT's pre-norm layer, or OPT-350M's post-norm one (`cfg.post_norm`): x = LN(x + attention(x)), then
    LN(x + MLP(x)), with the same two LayerNorms."""
    if not cfg.post_norm:
        return pre_norm_layer(cfg, x, cache, lw, layer, positions, rope)
    layout = cache.layout
    out, cache = self_attention(cfg, x, cache, lw, layer, positions, rope.for_layer(layer))
    x = layout.constrain(config_norm(x + out, lw.attn_norm, lw.attn_norm_bias, cfg), HIDDEN)
    x = config_norm(x + ungated_mlp(x, lw, cfg.activation), lw.mlp_norm, lw.mlp_norm_bias, cfg)
    return layout.constrain(x, HIDDEN), cache


FAMILY = Family("opt", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=(PREFIX + "embed_tokens.weight", PREFIX + "final_layer_norm.weight"),
                positions_name=PREFIX + "embed_positions.weight", required=REQUIRED)
