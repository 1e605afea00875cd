"""Swiss AI's Apertus (ApertusForCausalLM: Apertus-8B, -70B): the Llama layer with q/k norms and an ungated xIELU MLP.

Attention is Qwen3's (per-head q/k RMSNorms before the rotary embedding; q/k/v/o biases under
`attention_bias`); the norms before attention and the MLP are stored as `attention_layernorm` and
`feedforward_layernorm`. The MLP has no gate: down(xIELU(up(x))), xIELU being a piecewise function
with two learned slopes per layer (`models/xielu.py`). Fields a config leaves out take transformers'
ApertusConfig defaults (Llama 3 rope over 8192 original positions, x8, theta 1.2e7; 65536 positions).

Apertus 1.5 (Apertus1p5TextForCausalLM; Apertus1p5ForConditionalGeneration's language model run text-only, its
vision and audio tokenizers skipped: `models.text_part`) is this model over a vocabulary extended by visual and
audio codes, whose output head may be pruned to the first `output_vocab_size` ids: those run as the vocabulary (the
logits are the head's, as transformers returns them), the embedding rows past them (input-only codes) are not read
(`cfg.stored_vocab_size`), and a prompt holding such an id is refused as outside the vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.config.model import ConfigError, ModelConfig, common_fields, uniform_windows
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import Weight
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, attention_hf_leaves, attention_leaves, self_attention
from jaxinfer.models.xielu import xielu_hf_leaves, xielu_leaves, xielu_mlp
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("ApertusForCausalLM", "Apertus1p5TextForCausalLM", "Apertus1p5ForConditionalGeneration")
# ApertusConfig's defaults for fields a config leaves out.
DEFAULTS = dict(max_position_embeddings=65536, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
DEFAULT_ROPE = dict(rope_type="llama3", rope_theta=1.2e7, factor=8.0, original_max_position_embeddings=8192,
                    low_freq_factor=1.0, high_freq_factor=4.0)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ApertusLayerWeights:
    """One Apertus layer: pre-norm attention with q/k norms, then a pre-norm ungated xIELU MLP."""

    attn_norm: jax.Array  # [D]
    wq: Weight  # [D, H, K]
    wk: Weight  # [D, KV, K]
    wv: Weight  # [D, KV, K]
    wo: Weight  # [H, K, D]
    q_norm: jax.Array  # [K]
    k_norm: jax.Array  # [K]
    mlp_norm: jax.Array  # [D]
    w_up: Weight  # [D, F]
    w_down: Weight  # [F, D]
    alpha_p: jax.Array  # [1]: xIELU's positive slope, before softplus
    alpha_n: jax.Array  # [1]: its negative slope, before softplus
    beta: jax.Array  # []: its linear term
    eps: jax.Array  # []: its clamp of negative inputs
    bq: jax.Array | None = None  # [H, K]
    bk: jax.Array | None = None  # [KV, K]
    bv: jax.Array | None = None  # [KV, K]
    bo: jax.Array | None = None  # [D]

    PROJECTIONS: ClassVar[dict[str, int]] = {"wq": 1, "wk": 1, "wv": 1, "wo": 2, "w_up": 1, "w_down": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("wq", "wk", "wv"),)


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> ApertusLayerWeights:
    """One layer's leaves as ArrayInfos."""
    D, F = cfg.hidden_size, cfg.intermediate_size
    return ApertusLayerWeights(
        attn_norm=ArrayInfo((D,), ("embed",), init_value=1.0),
        mlp_norm=ArrayInfo((D,), ("embed",), init_value=1.0),
        w_up=ArrayInfo((D, F), ("embed", "mlp")),
        w_down=ArrayInfo((F, D), ("mlp", "embed")),
        **attention_leaves(cfg),
        **xielu_leaves(),
    )


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives in an HF checkpoint."""
    D, F, layer = cfg.hidden_size, cfg.intermediate_size, "model.layers.{i}."
    return {
        "attn_norm": HFLeaf(layer + "attention_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf(layer + "feedforward_layernorm.weight", "same", (D,)),
        "w_up": HFLeaf(layer + "mlp.up_proj.weight", "transpose", (F, D)),
        "w_down": HFLeaf(layer + "mlp.down_proj.weight", "transpose", (D, F)),
        **attention_hf_leaves(cfg),
        **xielu_hf_leaves(layer + "mlp.act_fn."),
    }


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: ApertusLayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """Pre-norm attention, then the pre-norm xIELU MLP, each added to the residual stream."""
    layout, eps = cache.layout, cfg.rms_norm_eps
    out, cache = self_attention(cfg, rms_norm(x, lw.attn_norm, eps), cache, lw, layer, positions,
                                rope.for_layer(layer))
    x = layout.constrain(x + out, HIDDEN)
    return layout.constrain(x + xielu_mlp(rms_norm(x, lw.mlp_norm, eps), lw), HIDDEN), cache


def pruned_vocab(hf: Mapping[str, Any], arch: str) -> dict[str, int]:
    """vocab_size and stored_vocab_size where Apertus 1.5's head is pruned to output_vocab_size ids; empty otherwise."""
    vocab, head = int(hf["vocab_size"]), hf.get("output_vocab_size")
    if head is None or int(head) == vocab:
        return {}
    if not 1 <= int(head) < vocab:
        raise ConfigError(f"output_vocab_size {head} is not supported for {arch}: the pruned head keeps ids "
                          f"[0, output_vocab_size) of the vocabulary, 1 <= output_vocab_size <= vocab_size ({vocab})")
    if hf.get("tie_word_embeddings"):
        raise ConfigError(f"output_vocab_size {head} with tie_word_embeddings=True is not supported for {arch}: a "
                          "pruned head is its own tensor (released checkpoints set tie_word_embeddings false)")
    return dict(vocab_size=int(head), stored_vocab_size=vocab)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an Apertus HF config (Apertus 1.5's text config too)."""
    hf = {**DEFAULTS, **hf}
    if not (hf.get("rope_parameters") or hf.get("rope_scaling")):
        hf["rope_parameters"] = {**DEFAULT_ROPE, **({"rope_theta": hf["rope_theta"]} if hf.get("rope_theta") else {})}
    fields = common_fields(hf, arch)
    act = hf.get("hidden_act") or "xielu"
    if act != "xielu":
        raise ConfigError(f"hidden_act {act!r} is not supported for {arch}: its MLP is read as xIELU's "
                          "(every released checkpoint's), with the activation's learned parameters")
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        **{**fields, **pruned_vocab(hf, arch)},
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        activation="xielu",
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
    )


FAMILY = Family("apertus", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
