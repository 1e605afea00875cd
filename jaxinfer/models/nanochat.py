"""Karpathy's nanochat (NanoChatForCausalLM: karpathy/nanochat-d32 and its kin): weightless RMSNorms throughout.

Every norm is an RMSNorm without a weight (`cfg.weightless_norms`: the layers', the final one's, and one on
the embeddings before the first layer, `cfg.embed_norm`); the MLP is ungated, fc2(relu(fc1(x)) ** 2) without
biases (`hidden_act` relu2). Attention is Llama's (q/k/v/o biased by `attention_bias`, GQA) with two changes:
its rotary embedding turns the other way (transformers' nanochat rotate_half is (x2, -x1), not (-x2, x1): a
rotation by minus the angle, so sin enters negated), and q and k are RMS-normed without a weight after the
rotation, as Llama 4's (`l2_norm`). The output logits are soft-capped (`final_logit_softcapping`, 15 by
default), as Gemma 2's; the head is untied by default.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax

from jaxinfer.config.model import ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.attention import attend
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import linear
from jaxinfer.models.llama4 import l2_norm
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import CosSin, RopeTables
from jaxinfer.models.self_attention import HIDDEN, Q_HEADS, attention_hf_leaves, project_qkv
from jaxinfer.models.ungated_mlp import UngatedLayerWeights, ungated_mlp
from jaxinfer.models.ungated_mlp import abstract_layer as ungated_layer

ARCHITECTURES = ("NanoChatForCausalLM",)
# NanoChatConfig's defaults for fields a config leaves out.
DEFAULTS = dict(hidden_act="relu2", final_logit_softcapping=15.0, max_position_embeddings=2048, bos_token_id=0,
                eos_token_id=1, tie_word_embeddings=False, attention_bias=False)


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> UngatedLayerWeights:
    """The ungated layer's leaves without norm weights."""
    return dataclasses.replace(ungated_layer(cfg, layer), attn_norm=None, mlp_norm=None)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Llama's attention names, the MLP's `fc1` / `fc2`."""
    D, F, layer = cfg.hidden_size, cfg.intermediate_size, "model.layers.{i}."
    return {
        **attention_hf_leaves(cfg),
        "w_up": HFLeaf(layer + "mlp.fc1.weight", "transpose", (F, D)),
        "w_down": HFLeaf(layer + "mlp.fc2.weight", "transpose", (D, F)),
    }


def attention(cfg: ModelConfig, h: jax.Array, cache: Any, lw: UngatedLayerWeights, layer: int,
              positions: jax.Array, rope: CosSin) -> tuple[jax.Array, Any]:
    """Attention of the normed input h [B, T, D]: q and k turned by minus the angle, then RMS-normed."""
    layout = cache.layout
    cos, sin = rope
    q, k, v = project_qkv(h, lw, cfg, (cos, -sin), layout)
    q, k = l2_norm(q, cfg.rms_norm_eps), l2_norm(k, cfg.rms_norm_eps)
    cache = cache.write(layer, k, v, positions)
    attn = attend(q, cache, layer, positions, cfg.layer_windows[layer])
    out = linear(layout.constrain(attn, Q_HEADS), lw.wo, contract=2)
    return (out if lw.bo is None else out + lw.bo), cache


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: UngatedLayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """Weightless pre-norm attention, then the weightless pre-norm ungated MLP, each added to the residual."""
    layout = cache.layout
    out, cache = attention(cfg, rms_norm(x, None, cfg.rms_norm_eps), cache, lw, layer, positions,
                           rope.for_layer(layer))
    x = layout.constrain(x + out, HIDDEN)
    h = ungated_mlp(rms_norm(x, None, cfg.rms_norm_eps), lw, cfg.activation)
    return layout.constrain(x + h, HIDDEN), cache


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a nanochat HF config."""
    hf = {**DEFAULTS, **hf}
    fields = common_fields(hf, arch)
    bias = bool(hf["attention_bias"])
    cap = field(hf, "final_logit_softcapping", None)
    return ModelConfig(
        **fields,
        qkv_bias=bias,
        o_bias=bias,
        weightless_norms=True,
        embed_norm=True,
        activation=activation_name(hf["hidden_act"] or "relu2"),
        final_soft_cap=None if cap is None else float(cap),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
    )


FAMILY = Family("nanochat", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
