"""Each distinct decoder layer traced once per program, not once per layer.

The layers stay unrolled (see decoder.py), but each is called through a nested `jax.jit` over
that layer's own cache buffers and weights. Layers alike in shapes and static settings (all of a
Llama; Gemma 2's local and global kinds) then share one trace and one lowered function, which
XLA inlines back into the program: the compiled program is the unrolled one, while tracing and
lowering (most of a warm start, which loads the compiled programs from the persistent cache)
no longer grow with depth.

A layer reads its index only to pick its cache buffers, its window or attention chunk, its K/V shape, its
activation sparsity (Gemma 3n's), its MLP clamps (Step 3.7's), its n-gram table (Qwen4-Exp's) and its rope tables,
so the call hands it a one-layer view of the cache as layer 0, a config whose every window, chunk, K/V shape,
sparsity, clamp and n-gram table are its own, and its rope tables ready made (None for a layer without rotary
embeddings). A layer attending over
another's K/V (Gemma 4's KV sharing: `cfg.kv_source`) is handed that layer's buffers and writes none, so nothing is
put back. A model with per-layer inputs (Gemma 4's `cfg.per_layer_input_size`; Qwen4-Exp's n-gram embeddings) or
reading the input embeddings (Zamba2: `Family.reads_embeddings`) hands each layer the step's `LayerInputs` as an
eighth argument.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.family import DecoderLayer
from jaxinfer.models.rope import CosSin, RopeTables


@dataclasses.dataclass(frozen=True)
class FixedRope:
    """Rope tables already picked for one layer (what `RopeTables.for_layer` gave it)."""

    tables: CosSin | None

    def for_layer(self, layer: int) -> CosSin | None:
        """The layer's cos, sin (whatever the index: the view holds one layer)."""
        return self.tables


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LayerInputs:
    """What a layer with per-layer inputs (Gemma 4's PLE) reads beside its hidden states."""

    tokens: jax.Array  # [B, T] int32
    embeds: jax.Array  # [B, T, D] the scaled input embeddings (overrides applied)


def call_layer(
    layer_fn: DecoderLayer, cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array,
    rope: RopeTables, inputs: LayerInputs | None = None,
) -> tuple[jax.Array, Any]:
    """`layer_fn` on layer `layer`, through the shared trace where the cache offers one-layer views."""
    extra = () if inputs is None else (inputs,)
    if not hasattr(cache, "layer_view"):
        return layer_fn(cfg, x, cache, lw, layer, positions, rope, *extra)
    window, chunk = cfg.layer_windows[layer], cfg.layer_chunks[layer]
    kv_heads, head_dim = cfg.kv_shape(layer)
    alike = dataclasses.replace(cfg, layer_windows=(window,) * cfg.num_layers, layer_chunks=(chunk,) * cfg.num_layers,
                                num_kv_heads=kv_heads, head_dim=head_dim, layer_kv_heads=(), layer_head_dims=(),
                                kv_sources=(), layer_sparsity=cfg.layer_sparsity[layer:layer + 1] * cfg.num_layers,
                                expert_swiglu_limits=cfg.expert_swiglu_limits[layer:layer + 1] * cfg.num_layers,
                                mlp_swiglu_limits=cfg.mlp_swiglu_limits[layer:layer + 1] * cfg.num_layers,
                                qwen4_exp=cfg.qwen4_exp and cfg.qwen4_exp.for_layer(layer))
    source = cfg.kv_source(layer)
    x, view = _one_layer(layer_fn, alike, x, cache.layer_view(source), lw, positions, rope.for_layer(layer), *extra)
    return x, cache if source != layer else cache.with_layer(layer, view)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _one_layer(
    layer_fn: DecoderLayer, cfg: ModelConfig, x: jax.Array, view: Any, lw: Any, positions: jax.Array,
    tables: CosSin | None, *extra: LayerInputs,
) -> tuple[jax.Array, Any]:
    return layer_fn(cfg, x, view, lw, 0, positions, FixedRope(tables), *extra)
