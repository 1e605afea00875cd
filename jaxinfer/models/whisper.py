"""Whisper's decoder (`WhisperForConditionalGeneration`) as a family of the shared decoder.

Each layer is pre-LayerNorm (with biases): causal self-attention over the paged KV cache, cross-attention over
the encoder's frames, then fc2(gelu(fc1(x))). Positions are learned (`embed_positions`, added to the token
embeddings: layer 0 carries the table and adds it, so no rope runs and the shared embedding code is unchanged);
the output head is tied to the embedding. The cross-attention keys and values are computed once per request from
the encoder's output (models/whisper_encoder) and kept in each row slot's run of cross pages (cache/cross_pool);
a layer's tokens attend their slots' pages in place, through the paged attention self-attention uses. HF's
k_proj has no bias (its q, v and out projections do). HF scales the queries before the product; here the
scores are (the same up to rounding).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.cache.cross_pool import cross_view
from jaxinfer.config.generation import token_ids
from jaxinfer.config.model import ConfigError, ModelConfig, field
from jaxinfer.models.attention import all_keys_attend, attend
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.mlp import activation
from jaxinfer.models.norms import layer_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, Q_HEADS
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("WhisperForConditionalGeneration",)
REQUIRED = ("vocab_size", "d_model", "decoder_layers", "decoder_attention_heads", "decoder_ffn_dim",
            "max_source_positions", "max_target_positions")
PREFIX = "model.decoder."


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class WhisperLayer:
    """One decoder layer; `positions` only in layer 0 (the learned position table its input adds)."""

    attn_norm: jax.Array  # [D]
    attn_norm_bias: jax.Array  # [D]
    wq: Weight  # [D, H, K]
    bq: jax.Array  # [H, K]
    wk: Weight  # [D, H, K] (no bias)
    wv: Weight  # [D, H, K]
    bv: jax.Array  # [H, K]
    wo: Weight  # [H, K, D]
    bo: jax.Array  # [D]
    cross_norm: jax.Array  # [D]
    cross_norm_bias: jax.Array  # [D]
    cq: Weight  # [D, H, K]: the cross-attention's queries (its keys and values are the encoder side's)
    cbq: jax.Array  # [H, K]
    co: Weight  # [H, K, D]
    cbo: jax.Array  # [D]
    mlp_norm: jax.Array  # [D]
    mlp_norm_bias: jax.Array  # [D]
    w_up: Weight  # [D, F]
    b_up: jax.Array  # [F]
    w_down: Weight  # [F, D]
    b_down: jax.Array  # [D]
    positions: jax.Array | None = None  # [max_target_positions, D], layer 0 only

    # The tree-wide transforms' view (models/weight_ops): the matmul weights; none joined (Whisper loads as read)
    PROJECTIONS: ClassVar[dict[str, int]] = {"wq": 1, "wk": 1, "wv": 1, "wo": 2, "cq": 1, "co": 2, "w_up": 1,
                                             "w_down": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = ()


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> WhisperLayer:
    """One layer's leaves as ArrayInfos."""
    D, H, K, F = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.intermediate_size
    norm = lambda: ArrayInfo((D,), ("embed",), init_value=1.0)  # noqa: E731
    vector = lambda: ArrayInfo((D,), ("embed",))  # noqa: E731
    heads_in = lambda: ArrayInfo((D, H, K), ("embed", "q_heads", "head_dim"))  # noqa: E731
    heads_bias = lambda: ArrayInfo((H, K), ("q_heads", "head_dim"))  # noqa: E731
    heads_out = lambda: ArrayInfo((H, K, D), ("q_heads", "head_dim", "embed"))  # noqa: E731
    return WhisperLayer(
        attn_norm=norm(), attn_norm_bias=vector(), wq=heads_in(), bq=heads_bias(), wk=heads_in(), wv=heads_in(),
        bv=heads_bias(), wo=heads_out(), bo=vector(), cross_norm=norm(), cross_norm_bias=vector(), cq=heads_in(),
        cbq=heads_bias(), co=heads_out(), cbo=vector(), mlp_norm=norm(), mlp_norm_bias=vector(),
        w_up=ArrayInfo((D, F), ("embed", "mlp")), b_up=ArrayInfo((F,), ("mlp",)),
        w_down=ArrayInfo((F, D), ("mlp", "embed")), b_down=vector(),
        positions=ArrayInfo((cfg.max_position_embeddings, D), (None, "embed")) if layer == 0 else None,
    )


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives in an HF checkpoint (the position table: layer 0's, see checkpoint/whisper)."""
    D, H, K, F = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.intermediate_size
    p = PREFIX + "layers.{i}."
    attention = lambda name: {  # noqa: E731
        "q": HFLeaf(p + name + ".q_proj.weight", "in_heads", (H * K, D), H, K),
        "bq": HFLeaf(p + name + ".q_proj.bias", "bias_heads", (H * K,), H, K),
        "o": HFLeaf(p + name + ".out_proj.weight", "out_heads", (D, H * K), H, K),
        "bo": HFLeaf(p + name + ".out_proj.bias", "same", (D,)),
    }
    own, cross = attention("self_attn"), attention("encoder_attn")
    return {
        "attn_norm": HFLeaf(p + "self_attn_layer_norm.weight", "same", (D,)),
        "attn_norm_bias": HFLeaf(p + "self_attn_layer_norm.bias", "same", (D,)),
        "wq": own["q"], "bq": own["bq"], "wo": own["o"], "bo": own["bo"],
        "wk": HFLeaf(p + "self_attn.k_proj.weight", "in_heads", (H * K, D), H, K),
        "wv": HFLeaf(p + "self_attn.v_proj.weight", "in_heads", (H * K, D), H, K),
        "bv": HFLeaf(p + "self_attn.v_proj.bias", "bias_heads", (H * K,), H, K),
        "cross_norm": HFLeaf(p + "encoder_attn_layer_norm.weight", "same", (D,)),
        "cross_norm_bias": HFLeaf(p + "encoder_attn_layer_norm.bias", "same", (D,)),
        "cq": cross["q"], "cbq": cross["bq"], "co": cross["o"], "cbo": cross["bo"],
        "mlp_norm": HFLeaf(p + "final_layer_norm.weight", "same", (D,)),
        "mlp_norm_bias": HFLeaf(p + "final_layer_norm.bias", "same", (D,)),
        "w_up": HFLeaf(p + "fc1.weight", "transpose", (F, D)),
        "b_up": HFLeaf(p + "fc1.bias", "same", (F,)),
        "w_down": HFLeaf(p + "fc2.weight", "transpose", (D, F)),
        "b_down": HFLeaf(p + "fc2.bias", "same", (D,)),
    }


def heads(x: jax.Array, w: Weight, bias: jax.Array | None) -> jax.Array:
    """x [B, T, D] projected to heads [B, T, H, K] (plus the bias where there is one)."""
    out = linear(x, w)
    return out if bias is None else out + bias


def self_attention(cfg: ModelConfig, h: jax.Array, cache: Any, lw: WhisperLayer, layer: int,
                   positions: jax.Array) -> tuple[jax.Array, Any]:
    """Causal attention of the normed h [B, T, D] over the cache, after writing this step's keys and values."""
    q, k, v = heads(h, lw.wq, lw.bq), heads(h, lw.wk, None), heads(h, lw.wv, lw.bv)
    cache = cache.write(layer, k, v, positions)
    attn = attend(q, cache, layer, positions, 0, scale=cfg.attn_scale)
    return linear(cache.layout.constrain(attn, Q_HEADS), lw.wo, contract=2) + lw.bo, cache


def cross_attention(cfg: ModelConfig, h: jax.Array, cache: Any, lw: WhisperLayer, layer: int,
                    positions: jax.Array) -> jax.Array:
    """Attention of the normed h [1, T, D] at positions [1, T] over each token's request's encoder frames: its
    row slot's cross pages, read in place (cache/cross_pool)."""
    pages = cross_view(cache, layer, cfg.encoder_frames)
    q = heads(h, lw.cq, lw.cbq)[0]  # [T, H, K]
    frames = jnp.full(q.shape[:1], cfg.encoder_frames, jnp.int32)
    attn = all_keys_attend(q, pages, frames, positions[0] >= 0, cfg.head_dim ** -0.5)
    return linear(attn[None].astype(h.dtype), lw.co, contract=2) + lw.cbo


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: WhisperLayer, layer: int, positions: jax.Array, rope: RopeTables
) -> tuple[jax.Array, Any]:
    """Self-attention, cross-attention and the MLP, each pre-LayerNorm and added to the residual stream."""
    if lw.positions is not None:  # layer 0: the learned positions join the token embeddings
        x = x + jnp.take(lw.positions, jnp.maximum(positions, 0), axis=0).astype(x.dtype)
    eps = cfg.rms_norm_eps
    attn, cache = self_attention(cfg, layer_norm(x, lw.attn_norm, eps, lw.attn_norm_bias), cache, lw, layer, positions)
    x = x + attn
    x = x + cross_attention(cfg, layer_norm(x, lw.cross_norm, eps, lw.cross_norm_bias), cache, lw, layer, positions)
    h = layer_norm(x, lw.mlp_norm, eps, lw.mlp_norm_bias)
    up = activation(cfg.activation, linear(h, lw.w_up) + lw.b_up)
    x = x + linear(up, lw.w_down) + lw.b_down
    return cache.layout.constrain(x, HIDDEN), cache


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of the decoder of a Whisper HF config (`encoder_frames`: the encoder's output length)."""
    act = field(hf, "activation_function", "gelu")
    if act != "gelu":
        raise ConfigError(f"activation_function {act!r} is not supported for {arch}; supported: 'gelu'")
    if field(hf, "scale_embedding", False):
        raise ConfigError(f"scale_embedding True is not supported for {arch}; supported: false (every released "
                          "Whisper checkpoint's)")
    D, H = int(hf["d_model"]), int(hf["decoder_attention_heads"])
    if D % H:
        raise ConfigError(f"d_model ({D}) must be a multiple of decoder_attention_heads ({H})")
    eos = field(hf, "eos_token_id", None)
    return ModelConfig(
        architecture=arch, vocab_size=int(hf["vocab_size"]), hidden_size=D,
        intermediate_size=int(hf["decoder_ffn_dim"]), num_layers=int(hf["decoder_layers"]), num_heads=H,
        num_kv_heads=H, head_dim=D // H, rms_norm_eps=1e-5, layer_norm=True, norm_bias=True,
        max_position_embeddings=int(hf["max_target_positions"]), tie_word_embeddings=True, activation="gelu",
        encoder_frames=int(hf["max_source_positions"]),
        bos_token_id=field(hf, "decoder_start_token_id", None), eos_token_ids=token_ids(eos),
    )


FAMILY = Family("whisper", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=(PREFIX + "embed_tokens.weight", PREFIX + "layer_norm.weight"), required=REQUIRED)
