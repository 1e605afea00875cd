"""The Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3, Gemma) as pure functions.

The families differ only by flags on ModelConfig (biases, q/k norm, norm offset, embedding
scale, activation, sliding windows), so one definition serves them all. Each layer owns its
weight buffers and the layers are unrolled: a `lax.scan` over stacked weights makes XLA copy
every layer's slice before its matmuls, which costs a third of decode speed on CPU.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jaxinfer.cache.contiguous import KVCache
from jaxinfer.config.model import ModelConfig
from jaxinfer.kernels.cpu import PackedWeight, pack_weight, packing_applies, unpack_weight
from jaxinfer.models.attention import attend
from jaxinfer.models.joined_weight import JoinedWeight, join, joinable, split
from jaxinfer.models.layers import (
    Weight,
    apply_rope,
    gated_mlp,
    linear,
    linear_transposed,
    linears,
    rms_norm,
    rope_cos_sin,
)
from jaxinfer.models.row_table import RowTable, as_row_table, full_table, take_rows
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout
from jaxinfer.quantization import quantized_weight
from jaxinfer.quantization.quantized_weight import QuantizedWeight

# Logical axes of activations; the rules table maps them like the weights' (see sharding.py).
HIDDEN = ("batch", "tokens", "embed")  # [B, T, D]
Q_HEADS = ("batch", "tokens", "q_heads", "head_dim")  # [B, T, H, K]
KV_HEADS = ("batch", "tokens", "kv_heads", "head_dim")  # [B, T, KV, K]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LayerWeights:
    """Weights of one decoder layer."""

    attn_norm: jax.Array  # [D]
    wq: Weight  # [D, H, K]
    wk: Weight  # [D, KV, K]
    wv: Weight  # [D, KV, K]
    wo: Weight  # [H, K, D]
    mlp_norm: jax.Array  # [D]
    w_gate: Weight  # [D, F]
    w_up: Weight  # [D, F]
    w_down: Weight  # [F, D]
    bq: jax.Array | None = None  # [H, K]
    bk: jax.Array | None = None  # [KV, K]
    bv: jax.Array | None = None  # [KV, K]
    bo: jax.Array | None = None  # [D]
    q_norm: jax.Array | None = None  # [K]
    k_norm: jax.Array | None = None  # [K]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Weights:
    """All weights of one model; `lm_head` is None when tied to the embedding (packed trees aside)."""

    embed: jax.Array | RowTable  # [V, D]; a RowTable only in the CPU kernels' tree (pack_for_cpu)
    layers: list[LayerWeights]
    final_norm: jax.Array  # [D]
    lm_head: Weight | None = None  # [D, V]


# Projection fields and how many leading axes each contracts with the activations.
PROJECTIONS = {"wq": 1, "wk": 1, "wv": 1, "wo": 2, "w_gate": 1, "w_up": 1, "w_down": 1}


def abstract_layer(cfg: ModelConfig) -> LayerWeights:
    """One decoder layer's leaves as ArrayInfos."""
    D, F = cfg.hidden_size, cfg.intermediate_size
    H, KV, K = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    norm = 0.0 if cfg.norm_weight_offset else 1.0
    return LayerWeights(
        attn_norm=ArrayInfo((D,), ("embed",), init_value=norm),
        wq=ArrayInfo((D, H, K), ("embed", "q_heads", "head_dim")),
        wk=ArrayInfo((D, KV, K), ("embed", "kv_heads", "head_dim")),
        wv=ArrayInfo((D, KV, K), ("embed", "kv_heads", "head_dim")),
        wo=ArrayInfo((H, K, D), ("q_heads", "head_dim", "embed")),
        mlp_norm=ArrayInfo((D,), ("embed",), init_value=norm),
        w_gate=ArrayInfo((D, F), ("embed", "mlp")),
        w_up=ArrayInfo((D, F), ("embed", "mlp")),
        w_down=ArrayInfo((F, D), ("mlp", "embed")),
        bq=ArrayInfo((H, K), ("q_heads", "head_dim")) if cfg.qkv_bias else None,
        bk=ArrayInfo((KV, K), ("kv_heads", "head_dim")) if cfg.qkv_bias else None,
        bv=ArrayInfo((KV, K), ("kv_heads", "head_dim")) if cfg.qkv_bias else None,
        bo=ArrayInfo((D,), ("embed",)) if cfg.o_bias else None,
        q_norm=ArrayInfo((K,), ("head_dim",), init_value=norm) if cfg.qk_norm else None,
        k_norm=ArrayInfo((K,), ("head_dim",), init_value=norm) if cfg.qk_norm else None,
    )


def abstract_weights(cfg: ModelConfig) -> Weights:
    """Every weight leaf as an ArrayInfo; init, loading and sharding derive from this tree."""
    D, V = cfg.hidden_size, cfg.vocab_size
    norm = 0.0 if cfg.norm_weight_offset else 1.0
    return Weights(
        embed=ArrayInfo((V, D), ("vocab", "embed")),
        layers=[abstract_layer(cfg) for _ in range(cfg.num_layers)],
        final_norm=ArrayInfo((D,), ("embed",), init_value=norm),
        lm_head=None if cfg.tie_word_embeddings else ArrayInfo((D, V), ("embed", "vocab")),
    )


def quantize_weights(weights: Weights, mode: str | None, group: int = quantized_weight.DEFAULT_GROUP) -> Weights:
    """The projections quantized to `mode` (embedding, head and norms as they are); None: `weights` unchanged.

    A tree already quantized (a converted checkpoint) is returned as it is when the mode and
    group match, and refused otherwise: quantizing quantized values again would lose accuracy.
    """
    if mode is None:
        return weights
    quantized_weight.check_mode(mode, group)
    first = weights.layers[0].wq
    if isinstance(first, QuantizedWeight):
        if (first.mode, first.group) != (mode, group if mode == "int4" else 0):
            raise ValueError(f"quantization={mode!r} (group {group}), but these weights are stored as "
                             f"{first.mode!r} (group {first.group}); load them with quantization=None")
        return weights
    layers = [
        dataclasses.replace(lw, **{
            name: quantized_weight.quantize(getattr(lw, name), c, mode, group, f"layers.{i}.{name}")
            for name, c in PROJECTIONS.items()
        })
        for i, lw in enumerate(weights.layers)
    ]
    return dataclasses.replace(weights, layers=layers)


def quantize_head(weights: Weights, mode: str, group: int, layout: Layout) -> Weights:
    """The output head quantized to `mode` like the projections; a tied head gets a quantized copy
    of the embedding's transpose (the lookup keeps the embedding as it is).

    Small models with large vocabularies spend a fifth or more of each decode step reading the
    head (SmolLM-135M: 28M of 135M parameters), so quantizing only the projections leaves that.
    """
    if isinstance(weights.lm_head, QuantizedWeight):
        return weights
    head = weights.embed.T if weights.lm_head is None else weights.lm_head
    q = quantized_weight.quantize(head, 1, mode, group, "lm_head")
    return dataclasses.replace(weights, lm_head=quantized_weight.shard_quantized(q, ("embed", "vocab"), layout))


def _pack_leaf(w: Weight, contract: int) -> Weight:
    """One projection in the CPU kernel's layout: quantized tiles, packed bf16, or as it is."""
    if isinstance(w, QuantizedWeight):
        return quantized_weight.tile(w)
    if isinstance(w, PackedWeight) or not packing_applies(w.dtype):
        return w
    return pack_weight(w, contract)


def _in_kernel_layout(w: Weight | None) -> bool:
    return isinstance(w, PackedWeight) or (isinstance(w, QuantizedWeight) and w.tiled)


def _unpack_leaf(w: Weight) -> Weight:
    """`_pack_leaf` undone (a copy of a packed leaf)."""
    if isinstance(w, QuantizedWeight):
        return quantized_weight.untile(w)
    return unpack_weight(w) if isinstance(w, PackedWeight) else w


def pack_for_cpu(weights: Weights) -> Weights:
    """The projections in the CPU kernel's layouts (bf16 packed, int8/int4 tiled), others as they are.

    For running only, when the CPU kernels are on: a packed tree is not the model's pytree
    (`unpack_for_cpu` gives that back). With bf16 weights the embedding is kept as its bits for
    the lookup (see row_table) and the output head is packed (a tied head gets a packed copy of
    the embedding's transpose: vocab x hidden more bf16 values), read at the kernel's speed; a
    quantized head (`quantize_head`) is tiled instead.
    """
    layers = [
        dataclasses.replace(lw, **{name: _pack_leaf(getattr(lw, name), c) for name, c in PROJECTIONS.items()})
        for lw in weights.layers
    ]
    lm_head, embed = weights.lm_head, weights.embed
    if lm_head is not None or packing_applies(embed.dtype):
        lm_head = _pack_leaf(embed.T if lm_head is None else lm_head, 1)
    if packing_applies(embed.dtype):  # the head is in a kernel layout then: the table only serves lookups
        embed = as_row_table(embed)
    return dataclasses.replace(weights, embed=embed, layers=layers, lm_head=lm_head)


# Projections that read the same activations: joined into the first field on one device (see joined_weight).
JOINED = (("wq", "wk", "wv"), ("w_gate", "w_up"))


def join_projections(weights: Weights, release: bool = False) -> Weights:
    """q/k/v and gate/up each as one `JoinedWeight` (in the first field, the others None) where joinable.

    For running on one device off the CPU kernels' path; `split_projections` gives the model's
    tree back. release: free the parts as they are joined (a tree nothing else holds).
    """

    def joined(lw: LayerWeights) -> LayerWeights:
        fields = {}
        for names in JOINED:
            parts = [getattr(lw, name) for name in names]
            if joinable(parts):
                fields.update({names[0]: join(parts, release), **{name: None for name in names[1:]}})
        return dataclasses.replace(lw, **fields)

    return dataclasses.replace(weights, layers=[joined(lw) for lw in weights.layers])


def split_projections(weights: Weights) -> Weights:
    """`join_projections` undone (copies of the parts); a tree with nothing joined as it is."""

    def split_layer(lw: LayerWeights) -> LayerWeights:
        fields = {}
        for names in JOINED:
            if isinstance(first := getattr(lw, names[0]), JoinedWeight):
                fields.update(zip(names, split(first)))
        return dataclasses.replace(lw, **fields)

    return dataclasses.replace(weights, layers=[split_layer(lw) for lw in weights.layers])


def mark_for_gpu_kernel(weights: Weights, interpret: bool = False) -> Weights:
    """Quantized projections (joined ones too) and head marked for the Triton decode kernel where it
    takes them (others as they are)."""

    def mark(w: Weight | None) -> Weight | None:
        if isinstance(w, JoinedWeight):
            return dataclasses.replace(w, weight=mark(w.weight))
        return quantized_weight.for_gpu_kernel(w, interpret) if isinstance(w, QuantizedWeight) else w

    layers = [dataclasses.replace(lw, **{name: mark(getattr(lw, name)) for name in PROJECTIONS}) for lw in weights.layers]
    return dataclasses.replace(weights, layers=layers, lm_head=mark(weights.lm_head))


def weights_to_run(weights: Weights, cpu_kernels: bool, quantized_kernel: bool, layout: Layout) -> Weights:
    """What runs (consumes `weights`): bf16 projections packed for the CPU kernels; on one device
    q/k/v and gate/up joined where not packed (see joined_weight); quantized ones marked for the GPU's kernel."""
    if cpu_kernels:
        weights = pack_for_cpu(weights)
    if layout.size == 1:
        weights = join_projections(weights, release=True)
    if quantized_kernel:
        weights = mark_for_gpu_kernel(weights, interpret=jax.default_backend() != "gpu")
    return weights


def unpack_for_cpu(packed: Weights, tied: bool) -> Weights:
    """The model's weights back from `pack_for_cpu`'s tree (a copy of each packed leaf); others as they are.

    A tied model's running head (a packed or quantized copy of the embedding) is dropped; joined
    projections are split.
    """
    packed = split_projections(packed)
    packed_any = isinstance(packed.embed, RowTable) or any(
        _in_kernel_layout(w) for w in (packed.layers[0].wq, packed.lm_head)
    )
    if not packed_any:  # nothing was packed: the tree itself, no copy
        return dataclasses.replace(packed, lm_head=None) if tied and packed.lm_head is not None else packed
    layers = [
        dataclasses.replace(lw, **{name: _unpack_leaf(getattr(lw, name)) for name in PROJECTIONS})
        for lw in packed.layers
    ]
    lm_head = None if tied else _unpack_leaf(packed.lm_head)
    return dataclasses.replace(packed, embed=full_table(packed.embed), layers=layers, lm_head=lm_head)


def embed_tokens(weights: Weights, tokens: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Token embeddings [B, T, D]; Gemma scales them by sqrt(D) in the weight dtype, as HF does."""
    x = take_rows(weights.embed, tokens)
    if cfg.scale_embeddings:
        x = x * jnp.asarray(math.sqrt(cfg.hidden_size), dtype=x.dtype)
    return x


def _project_qkv(
    x: jax.Array, lw: LayerWeights, cfg: ModelConfig, cos: jax.Array, sin: jax.Array, layout: Layout
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q [B,T,H,K], k/v [B,T,KV,K] with biases, q/k norms and rotary embeddings applied."""
    q, k, v = linears(x, [lw.wq, lw.wk, lw.wv])
    q, k, v = layout.constrain(q, Q_HEADS), layout.constrain(k, KV_HEADS), layout.constrain(v, KV_HEADS)
    if lw.bq is not None:
        q, k, v = q + lw.bq, k + lw.bk, v + lw.bv
    if lw.q_norm is not None:
        q = rms_norm(q, lw.q_norm, cfg.rms_norm_eps, cfg.norm_weight_offset)
        k = rms_norm(k, lw.k_norm, cfg.rms_norm_eps, cfg.norm_weight_offset)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def _decoder_layer(
    cfg: ModelConfig,
    x: jax.Array,
    cache: KVCache,
    lw: LayerWeights,
    layer: int,
    window: int,
    positions: jax.Array,
    cos: jax.Array,
    sin: jax.Array,
) -> tuple[jax.Array, KVCache]:
    """One pre-norm block: attention over the cache (after writing this step's K/V), then MLP."""
    layout = cache.layout
    h = rms_norm(x, lw.attn_norm, cfg.rms_norm_eps, cfg.norm_weight_offset)
    q, k, v = _project_qkv(h, lw, cfg, cos, sin, layout)
    cache = cache.write(layer, k, v, positions)
    attn = layout.constrain(attend(q, cache, layer, positions, window), Q_HEADS)
    out = linear(attn, lw.wo, contract=2)
    if lw.bo is not None:
        out = out + lw.bo
    x = layout.constrain(x + out, HIDDEN)
    h = rms_norm(x, lw.mlp_norm, cfg.rms_norm_eps, cfg.norm_weight_offset)
    return layout.constrain(x + gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation), HIDDEN), cache


def forward(
    weights: Weights, tokens: jax.Array, positions: jax.Array, cache: KVCache, cfg: ModelConfig
) -> tuple[jax.Array, KVCache]:
    """Run the decoder on tokens [B, T] at positions [B, T]; returns final hidden [B, T, D] and cache."""
    hidden, _, cache = forward_with_taps(weights, tokens, positions, cache, cfg, ())
    return hidden, cache


def forward_with_taps(
    weights: Weights, tokens: jax.Array, positions: jax.Array, cache: KVCache, cfg: ModelConfig,
    taps: tuple[int, ...],
) -> tuple[jax.Array, list[jax.Array], KVCache]:
    """`forward`, also returning the residual stream [B, T, D] entering each layer in `taps` (EAGLE-3 reads them)."""
    x = cache.layout.constrain(embed_tokens(weights, tokens, cfg), HIDDEN)
    cos, sin = rope_cos_sin(positions, cfg)
    tapped = []
    for layer, (lw, window) in enumerate(zip(weights.layers, cfg.layer_windows)):
        if layer in taps:
            tapped.append(x)
        x, cache = _decoder_layer(cfg, x, cache, lw, layer, window, positions, cos, sin)
    return rms_norm(x, weights.final_norm, cfg.rms_norm_eps, cfg.norm_weight_offset), tapped, cache


def lm_logits(weights: Weights, hidden: jax.Array) -> jax.Array:
    """Float32 next-token logits [..., V] from final hidden states [..., D]."""
    if weights.lm_head is None:
        return linear_transposed(hidden, weights.embed)
    return linear(hidden, weights.lm_head, out_dtype=jnp.float32)
