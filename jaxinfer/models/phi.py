"""Microsoft's Phi-1, Phi-1.5 and Phi-2 (PhiForCausalLM): one LayerNorm feeding attention and a GELU MLP in parallel.

`models.ungated_mlp`'s layer with its residual in parallel (`cfg.parallel_residual`) and one norm: each
layer's `input_layernorm` (with a bias) feeds both attention and fc2(gelu_new(fc1(x))), added to its input
together (`mlp_norm` None). Every projection has a bias; only the leading `partial_rotary_factor` of each
head's dims rotate (`cfg.rotary_dim`); with `qk_layernorm` q and k pass through LayerNorms with one weight
and bias over a head's dims that every head shares. A final LayerNorm (`final_layernorm`) and an output head
with a bias (`cfg.lm_head_bias`). Fields a config leaves out take transformers' PhiConfig defaults (half of
each head rotated, gelu_new, untied head).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxinfer.config.model import ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.phi3 import partial_rotary_dims
from jaxinfer.models.self_attention import attention_hf_leaves
from jaxinfer.models.ungated_mlp import UngatedLayerWeights, decoder_layer
from jaxinfer.models.ungated_mlp import abstract_layer as ungated_layer
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("PhiForCausalLM",)
# PhiConfig's defaults for fields a config leaves out.
DEFAULTS = dict(hidden_act="gelu_new", layer_norm_eps=1e-5, max_position_embeddings=2048, bos_token_id=1,
                eos_token_id=2, tie_word_embeddings=False, qk_layernorm=False)


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> UngatedLayerWeights:
    """One layer's leaves as ArrayInfos: the ungated layer's without an MLP norm, q/k norms of one head's dims."""
    K = cfg.head_dim
    qk = {}
    if cfg.qk_norm:
        norm, bias = ArrayInfo((K,), ("head_dim",), init_value=1.0), ArrayInfo((K,), ("head_dim",))
        qk = dict(q_norm=norm, k_norm=norm, q_norm_bias=bias, k_norm_bias=bias)
    return dataclasses.replace(ungated_layer(cfg, layer), mlp_norm=None, mlp_norm_bias=None, **qk)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives: Llama's q/k/v names, the output projection `dense`, the MLP's `fc1` / `fc2`."""
    H, K, D, F = cfg.num_heads, cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
    layer = "model.layers.{i}."
    attn = layer + "self_attn."
    leaves = {
        **attention_hf_leaves(dataclasses.replace(cfg, qk_norm=False), attn),
        "wo": HFLeaf(attn + "dense.weight", "out_heads", (D, H * K), H, K),
        "bo": HFLeaf(attn + "dense.bias", "same", (D,)),
        "attn_norm": HFLeaf(layer + "input_layernorm.weight", "same", (D,)),
        "attn_norm_bias": HFLeaf(layer + "input_layernorm.bias", "same", (D,)),
        "w_up": HFLeaf(layer + "mlp.fc1.weight", "transpose", (F, D)),
        "b_up": HFLeaf(layer + "mlp.fc1.bias", "same", (F,)),
        "w_down": HFLeaf(layer + "mlp.fc2.weight", "transpose", (D, F)),
        "b_down": HFLeaf(layer + "mlp.fc2.bias", "same", (D,)),
    }
    if cfg.qk_norm:
        for p in "qk":
            leaves[f"{p}_norm"] = HFLeaf(f"{attn}{p}_layernorm.weight", "same", (K,))
            leaves[f"{p}_norm_bias"] = HFLeaf(f"{attn}{p}_layernorm.bias", "same", (K,))
    return leaves


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Phi-1 / 1.5 / 2 HF config."""
    hf = {**DEFAULTS, **hf}
    fields = common_fields(hf, arch)
    return ModelConfig(
        **{**fields, "rms_norm_eps": float(hf["layer_norm_eps"])},
        layer_norm=True,
        norm_bias=True,
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        qk_norm=bool(hf["qk_layernorm"]),
        parallel_residual=True,
        lm_head_bias=True,
        rotary_dim=partial_rotary_dims(hf, fields["head_dim"], 0.5),
        activation=activation_name(field(hf, "hidden_act", "gelu_new")),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
    )


FAMILY = Family("phi", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=("model.embed_tokens.weight", "model.final_layernorm.weight"))
