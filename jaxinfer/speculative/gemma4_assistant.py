"""Gemma 4's speculative drafter (transformers' Gemma4AssistantForCausalLM, google/gemma-4-*-assistant).

A small Gemma 4 text model with no K/V of its own: each of its layers attends over the target's K/V of the
last K/V-writing target layer of its type (HF's `shared_kv_states`). One draft step reads the target's scaled
embedding of the last token t_P and a backbone-width state h (the target's final post-norm hidden state at
P-1 for the first step, the assistant's own `post_projection` output after that):
x = pre_projection([embed(t_P); h]), its layers at position P (the same P for every step of a draft round, as
HF's candidate generator runs it) over the target's keys before P (a sliding layer: the last window + 1 of
them, HF's flipped bidirectional window), the final norm; post_projection gives the next step's h and its
tied LM head the logits, or only those of the top-k centroids' tokens (`use_ordered_embeddings`: the others
one below the smallest of them, as `Gemma4AssistantMaskedEmbedder` fills them).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, ModelConfig
from jaxinfer.models.attention import dense_attention
from jaxinfer.models.gemma4 import ARCHITECTURES as TARGET_ARCHITECTURES
from jaxinfer.models.gemma4 import Gemma4LayerWeights, abstract_layer
from jaxinfer.models.gemma4_config import read_config
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables, apply_rope
from jaxinfer.models.row_table import take_rows
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURE = "Gemma4AssistantForCausalLM"
LAYERS_ARCHITECTURE = "Gemma4ForCausalLM"  # its text model's tensors are named as this family's
# text_config settings transformers' Gemma4AssistantConfig itself refuses: (field, the one accepted value)
FIXED_TEXT_FIELDS = (("hidden_size_per_layer_input", 0), ("enable_moe_block", False), ("use_double_wide_mlp", False))


@dataclasses.dataclass(frozen=True)
class AssistantConfig:
    """Shape of an assistant; hashable (a static argument of compiled code)."""

    layers: ModelConfig  # its Gemma 4 text model read without K/V sharing (its own K/V are the target's: `reads`)
    backbone_hidden_size: int  # the target's hidden size
    reads: tuple[int, ...]  # per assistant layer: the target layer whose K/V it attends over
    num_centroids: int = 0  # use_ordered_embeddings: the centroids; 0: the full LM head
    centroid_top_k: int = 0  # use_ordered_embeddings: the centroids whose tokens get logits


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class AssistantWeights:
    """The assistant's weights; the target's embedding travels beside them."""

    pre_projection: Weight  # [2 B, D] over [the target's embedding; the backbone state], B the target's width
    layers: list[Gemma4LayerWeights]  # no wk, wv, k_norm: the target's K/V
    norm: jax.Array  # [D]
    post_projection: Weight  # [D, B]
    embed: jax.Array  # [V, D] its own embedding, read only as its tied LM head
    centroids: Weight | None = None  # [D, C]
    token_ordering: jax.Array | None = None  # [C, V / C] int32: each centroid's token ids


def _target_store_layers(target: ModelConfig) -> dict[str, int]:
    """Layer type -> the target's last layer of that type that writes K/V (HF's "store" layer)."""
    kinds = {}
    for i in range(target.num_layers):
        if target.kv_source(i) == i:
            kinds["sliding_attention" if target.layer_windows[i] else "full_attention"] = i
    return kinds


def _check_text(text: Mapping[str, Any], target: ModelConfig, backbone: int) -> None:
    """ConfigError unless the assistant fits the target: its width, vocabulary and fixed settings."""
    if target.architecture not in TARGET_ARCHITECTURES:
        raise ConfigError(f"a {ARCHITECTURE} drafts for Gemma 4 targets ({', '.join(TARGET_ARCHITECTURES)}), "
                          f"not {target.architecture}")
    if backbone != target.hidden_size:
        raise ConfigError(f"the assistant's backbone_hidden_size {backbone} differs from the target's hidden_size "
                          f"{target.hidden_size}: it was trained for another Gemma 4 model")
    if int(text["vocab_size"]) != target.vocab_size:
        raise ConfigError(f"the assistant's text_config.vocab_size {text['vocab_size']} differs from the target's "
                          f"vocab_size {target.vocab_size}: its tokens would not be the target's")
    for name, accepted in FIXED_TEXT_FIELDS:
        if (text.get(name) or accepted) != accepted:
            raise ConfigError(f"the assistant's text_config.{name}={text[name]!r} is not supported; accepted: "
                              f"{accepted!r} (transformers' Gemma4AssistantConfig refuses it too)")


def read_assistant_config(hf: Mapping[str, Any], target: ModelConfig) -> AssistantConfig:
    """AssistantConfig of an assistant's config.json for `target`; ConfigError naming a mismatch."""
    archs = hf.get("architectures") or []
    if archs != [ARCHITECTURE]:
        raise ConfigError(f"expected a {ARCHITECTURE} checkpoint (architectures), got {archs}")
    text, backbone = hf.get("text_config") or {}, int(hf.get("backbone_hidden_size", 1536))
    _check_text(text, target, backbone)
    # every layer reads the target's K/V: its own shapes are read as a Gemma 4 without sharing
    layers = read_config({**text, "num_kv_shared_layers": 0}, LAYERS_ARCHITECTURE)
    stores = _target_store_layers(target)
    reads = []
    for i in range(layers.num_layers):
        kind = "sliding_attention" if layers.layer_windows[i] else "full_attention"
        if kind not in stores:
            raise ConfigError(f"the assistant's layer {i} is {kind} but the target has no {kind} layer to read")
        if layers.kv_shape(i) != target.kv_shape(stores[kind]):
            raise ConfigError(f"the assistant's layer {i} reads (kv heads, head dim) {layers.kv_shape(i)} but the "
                              f"target's layer {stores[kind]} ({kind}) writes {target.kv_shape(stores[kind])}")
        reads.append(stores[kind])
    ordered = bool(hf.get("use_ordered_embeddings"))
    centroids = int(hf.get("num_centroids", 2048)) if ordered else 0
    if ordered and (centroids < 1 or layers.vocab_size % centroids):
        raise ConfigError(f"num_centroids {centroids} must divide vocab_size {layers.vocab_size} "
                          "(use_ordered_embeddings: each centroid holds vocab_size / num_centroids tokens)")
    top_k = int(hf.get("centroid_intermediate_top_k", 32)) if ordered else 0
    if ordered and not 1 <= top_k <= centroids:
        raise ConfigError(f"centroid_intermediate_top_k {top_k} must be between 1 and num_centroids {centroids}")
    return AssistantConfig(layers, backbone, tuple(reads), centroids, top_k)


def abstract_assistant(acfg: AssistantConfig) -> AssistantWeights:
    """Every leaf of an assistant as an ArrayInfo (token_ordering, an integer table, is loaded, never initialised)."""
    cfg, B, C = acfg.layers, acfg.backbone_hidden_size, acfg.num_centroids
    D, V = cfg.hidden_size, cfg.vocab_size
    no_kv = dict(wk=None, wv=None, k_norm=None)
    return AssistantWeights(
        pre_projection=ArrayInfo((2 * B, D), (None, "embed")),
        layers=[dataclasses.replace(abstract_layer(cfg, i), **no_kv) for i in range(cfg.num_layers)],
        norm=ArrayInfo((D,), ("embed",), init_value=1.0),
        post_projection=ArrayInfo((D, B), ("embed", None)),
        embed=ArrayInfo((V, D), ("vocab", "embed")),
        centroids=ArrayInfo((D, C), ("embed", None)) if C else None,
        token_ordering=ArrayInfo((C, V // C), (None, None), dtype="int32") if C else None,
    )


def _norm(x: jax.Array, weight: jax.Array, cfg: ModelConfig) -> jax.Array:
    return rms_norm(x, weight, cfg.rms_norm_eps, scale_first=True)


def context_mask(positions: jax.Array, keys: int, window: int) -> jax.Array:
    """[B, 1, S] the target keys a query at positions [B] reads: those before it, on a sliding layer only the
    last window + 1 of them (HF's bidirectional window of |q - kv| <= window, flipped to look back)."""
    key_positions = jnp.arange(keys, dtype=jnp.int32)[None, :]
    before = key_positions < positions[:, None]
    if window:
        before &= key_positions >= positions[:, None] - 1 - window
    return before[:, None, :]


# (assistant layer i, its queries [B, 1, H, K]) -> attention [B, 1, H, K] over the target's K/V that layer reads
TargetAttention = Callable[[int, jax.Array], jax.Array]


def _layer(cfg: ModelConfig, x: jax.Array, lw: Gemma4LayerWeights, layer: int, rope: RopeTables,
           attend: TargetAttention) -> jax.Array:
    """One assistant layer over x [B, 1, D]: Gemma 4's sandwich-normed layer whose queries read the target's K/V."""
    q = linear(_norm(x, lw.attn_norm, cfg), lw.wq)
    q = apply_rope(_norm(q, lw.q_norm, cfg), *rope.for_layer(layer))
    attn = attend(layer, q)
    x = x + _norm(linear(attn.astype(x.dtype), lw.wo, contract=2), lw.post_attn_norm, cfg)
    h = gated_mlp(_norm(x, lw.mlp_norm, cfg), lw.w_gate, lw.w_up, lw.w_down, cfg.activation)
    x = x + _norm(h, lw.post_mlp_norm, cfg)
    return x * lw.layer_scalar.astype(x.dtype)


def assistant_logits(w: AssistantWeights, out: jax.Array, acfg: AssistantConfig) -> jax.Array:
    """Float32 logits [B, V] of the final-normed output [B, D]: the tied head, or under ordered embeddings its rows
    of the top-k centroids' tokens and one below their smallest logit elsewhere."""
    product = lambda rows: jnp.einsum(  # noqa: E731
        "bd,...d->b...", out.astype(jnp.float32), rows.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    if not acfg.num_centroids:
        return product(w.embed)
    _, top = jax.lax.top_k(linear(out, w.centroids, out_dtype=jnp.float32), acfg.centroid_top_k)  # [B, k]
    ids = w.token_ordering[top].reshape(out.shape[0], -1)  # [B, k * V / C]
    picked = jnp.einsum("bd,bnd->bn", out.astype(jnp.float32), take_rows(w.embed, ids).astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST)
    fill = jnp.min(picked, axis=-1, keepdims=True) - 1.0
    full = jnp.broadcast_to(fill, (out.shape[0], acfg.layers.vocab_size))
    return full.at[jnp.arange(out.shape[0])[:, None], ids].set(picked)


def assistant_step(
    w: AssistantWeights, acfg: AssistantConfig, target_embed: jax.Array, tokens: jax.Array, state: jax.Array,
    positions: jax.Array, kv: Sequence[tuple[jax.Array, jax.Array]],
) -> tuple[jax.Array, jax.Array]:
    """One draft step of rows reading tokens [B] (t_P), backbone states [B, B_h] and positions [B] (P), over the
    target's K/V kv[i] = (keys [B, KV, S, K], values [B, KV, K, S]) of the layer assistant layer i reads (position
    j at index j). Returns the next step's state [B, B_h] and float32 logits [B, V] of t_{P+1}."""
    cfg = acfg.layers

    def attend(layer: int, q: jax.Array) -> jax.Array:
        keys, values = kv[layer]
        mask = context_mask(positions, keys.shape[2], cfg.layer_windows[layer])
        return dense_attention(q, keys, values, mask, scale=cfg.attn_scale)

    return assistant_forward(w, acfg, target_embed, tokens, state, positions, attend)


def assistant_forward(
    w: AssistantWeights, acfg: AssistantConfig, target_embed: jax.Array, tokens: jax.Array, state: jax.Array,
    positions: jax.Array, attend: TargetAttention,
) -> tuple[jax.Array, jax.Array]:
    """`assistant_step` with the target's K/V read by `attend` (a dense cache's above, the engine's page pools in
    runtime/assistant_rider): the next step's state [B, B_h] and float32 logits [B, V]."""
    cfg = acfg.layers
    embeds = take_rows(target_embed, tokens)
    embeds = embeds * jnp.asarray(math.sqrt(acfg.backbone_hidden_size), embeds.dtype)  # the target's scaling
    x = linear(jnp.concatenate([embeds, state.astype(embeds.dtype)], axis=-1), w.pre_projection)[:, None]
    rope = RopeTables(positions[:, None], cfg)
    for i, lw in enumerate(w.layers):
        x = _layer(cfg, x, lw, i, rope, attend)
    out = _norm(x[:, 0], w.norm, cfg)
    return linear(out, w.post_projection), assistant_logits(w, out, acfg)
