"""Gemma 3n (text): Gemma3nForCausalLM, and Gemma3nForConditionalGeneration's language model run text-only.

Gemma 4's attention (models/gemma4: q/k norms scaling by w, values RMS-normed without a weight, unscaled
scores, sliding and global layers, KV sharing: the last `num_kv_shared_layers` layers keep no pages and read
the last earlier layer of their type's) and its per-layer inputs (PLE; the token table over the first
`vocab_size_per_layer_input` ids, the others reading row 0), inside transformers' Gemma 3n layer:
- the residual is AltUp's streams [A, B, T, D] (models/gemma3n_altup): the first layer expands the embeddings
  into them (`altup_in`: transformers' `altup_projections`), each layer predicts them, runs on the active one
  and corrects them all, the last collapses them (`altup_out`: `altup_unembed_projections`) before the final norm;
- beside attention a low-rank residual (LAuReL): the sum (input + attention + laurel) is divided by sqrt(2);
- the first layers' MLP gates pass a Gaussian top-k cutoff (`cfg.layer_sparsity`);
- the per-layer input is gated by the corrected active stream (times `altup_correct_scale`'s learned scale) and
  added to every stream but the first.
Not matched: transformers' Gemma3nModel embeds ids from `vocab_size_per_layer_input` on (the image and audio soft
tokens) through its multimodal embedders; here they read `embed_tokens` like any id (text reaches them only as those
special tokens written out).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.gemma3n_altup import STREAMS, collapse, correct, expand, halved, laurel, predict, sparse_mlp
from jaxinfer.models.gemma3n_config import read_config
from jaxinfer.models.gemma4 import attention, per_layer_input
from jaxinfer.models.layer_calls import LayerInputs
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.mlp import gate_product, mlp_hf_leaves, mlp_leaves
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("Gemma3nForCausalLM", "Gemma3nForConditionalGeneration")
LAYER = "model.layers.{i}."
NORMS = {"attn_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm",
         "mlp_norm": "pre_feedforward_layernorm", "post_mlp_norm": "post_feedforward_layernorm",
         "ple_post_norm": "post_per_layer_input_norm", "laurel_norm": "laurel.post_laurel_norm",
         "altup_router_norm": "altup.router_norm", "altup_scale": "altup.correct_output_scale"}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Gemma3nLayerWeights:
    """One Gemma 3n layer; a KV-sharing layer has no wk, wv, k_norm; only the first has altup_in, the last
    altup_out."""

    attn_norm: jax.Array  # [D]
    wq: Weight  # [D, H, K]
    wo: Weight  # [H, K, D]
    q_norm: jax.Array  # [K]
    post_attn_norm: jax.Array  # [D]
    mlp_norm: jax.Array  # [D]
    w_gate: Weight  # [D, F]
    w_up: Weight  # [D, F]
    w_down: Weight  # [F, D]
    post_mlp_norm: jax.Array  # [D]
    # per-layer inputs: this layer's slices of the packed tables, and its gate, projection and norms
    ple_embed: jax.Array  # [Vp, P]
    ple_proj: jax.Array  # [D, P]
    ple_norm: jax.Array  # [P] (every layer's copy of the one per_layer_projection_norm)
    ple_gate: Weight  # [D, P]
    ple_out: Weight  # [P, D]
    ple_post_norm: jax.Array  # [D]
    # LAuReL
    laurel_left: Weight  # [D, R]
    laurel_right: Weight  # [R, D]
    laurel_norm: jax.Array  # [D]
    # AltUp
    altup_router_norm: jax.Array  # [D]
    altup_router: Weight  # [D, A]
    altup_predict: Weight  # [A, A * A]
    altup_correct: Weight  # [A, A]
    altup_scale: jax.Array  # [D]
    wk: Weight | None = None  # [D, KV, K]
    wv: Weight | None = None  # [D, KV, K]
    k_norm: jax.Array | None = None  # [K]
    altup_in: jax.Array | None = None  # [A - 1, D, D]: the first layer's, expanding the embeddings
    altup_out: jax.Array | None = None  # [A - 1, D, D]: the last layer's, collapsing the streams

    PROJECTIONS: ClassVar[dict[str, int]] = {"wq": 1, "wk": 1, "wv": 1, "wo": 2, "w_gate": 1, "w_up": 1, "w_down": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("wq", "wk", "wv"), ("w_gate", "w_up"))


def abstract_layer(cfg: ModelConfig, layer: int) -> Gemma3nLayerWeights:
    """Layer `layer`'s leaves as ArrayInfos (norm weights start at 1: Gemma 3n scales by w itself)."""
    D, H, K, KV, P = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.num_kv_heads, cfg.per_layer_input_size
    A, R = cfg.gemma3n.altup_inputs, cfg.gemma3n.laurel_rank
    norm = lambda n, axes=("embed",): ArrayInfo((n,), axes, init_value=1.0)  # noqa: E731
    streams = ArrayInfo((A - 1, D, D), (None, "embed", None))
    leaves: dict[str, Any] = dict(
        **{name: norm(D) for name in NORMS}, **mlp_leaves(D, cfg.layer_intermediate_sizes[layer]),
        wq=ArrayInfo((D, H, K), ("embed", "q_heads", "head_dim")),
        wo=ArrayInfo((H, K, D), ("q_heads", "head_dim", "embed")),
        q_norm=norm(K, ("head_dim",)),
        ple_embed=ArrayInfo((cfg.gemma3n.per_layer_vocab, P), ("vocab", None)),
        ple_proj=ArrayInfo((D, P), ("embed", None)), ple_norm=norm(P, (None,)),
        ple_gate=ArrayInfo((D, P), ("embed", None)), ple_out=ArrayInfo((P, D), (None, "embed")),
        laurel_left=ArrayInfo((D, R), ("embed", None)), laurel_right=ArrayInfo((R, D), (None, "embed")),
        altup_router=ArrayInfo((D, A), ("embed", None)), altup_predict=ArrayInfo((A, A * A), (None, None)),
        altup_correct=ArrayInfo((A, A), (None, None)),
        altup_in=streams if layer == 0 else None, altup_out=streams if layer == cfg.num_layers - 1 else None,
    )
    if cfg.kv_source(layer) == layer:  # a KV-sharing layer has no k/v projections
        kv = ArrayInfo((D, KV, K), ("embed", "kv_heads", "head_dim"))
        leaves.update(wk=kv, wv=kv, k_norm=norm(K, ("head_dim",)))
    return Gemma3nLayerWeights(**leaves)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives (the MLP at layer 0's width; `layer_hf_leaves` gives each layer's own)."""
    D, H, K, KV, P = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.num_kv_heads, cfg.per_layer_input_size
    A, R = cfg.gemma3n.altup_inputs, cfg.gemma3n.laurel_rank
    attn = LAYER + "self_attn."
    return {
        **{name: HFLeaf(f"{LAYER}{hf}.weight", "same", (D,)) for name, hf in NORMS.items() if name != "altup_scale"},
        "altup_scale": HFLeaf(LAYER + "altup.correct_output_scale", "same", (D,)),
        **mlp_hf_leaves(D, cfg.layer_intermediate_sizes[0]),
        "wq": HFLeaf(attn + "q_proj.weight", "in_heads", (H * K, D), H, K),
        "wk": HFLeaf(attn + "k_proj.weight", "in_heads", (KV * K, D), KV, K),
        "wv": HFLeaf(attn + "v_proj.weight", "in_heads", (KV * K, D), KV, K),
        "wo": HFLeaf(attn + "o_proj.weight", "out_heads", (D, H * K), H, K),
        "q_norm": HFLeaf(attn + "q_norm.weight", "same", (K,)),
        "k_norm": HFLeaf(attn + "k_norm.weight", "same", (K,)),
        "ple_norm": HFLeaf("model.per_layer_projection_norm.weight", "same", (P,)),
        "ple_gate": HFLeaf(LAYER + "per_layer_input_gate.weight", "transpose", (P, D)),
        "ple_out": HFLeaf(LAYER + "per_layer_projection.weight", "transpose", (D, P)),
        "laurel_left": HFLeaf(LAYER + "laurel.linear_left.weight", "transpose", (R, D)),
        "laurel_right": HFLeaf(LAYER + "laurel.linear_right.weight", "transpose", (D, R)),
        "altup_router": HFLeaf(LAYER + "altup.modality_router.weight", "transpose", (A, D)),
        "altup_predict": HFLeaf(LAYER + "altup.prediction_coefs.weight", "transpose", (A * A, A)),
        "altup_correct": HFLeaf(LAYER + "altup.correction_coefs.weight", "transpose", (A, A)),
        "altup_in": HFLeaf("model.altup_projections.{e}.weight", "transpose", (D, D), experts=A - 1),
        "altup_out": HFLeaf("model.altup_unembed_projections.{e}.weight", "transpose", (D, D), experts=A - 1),
    }


def layer_hf_leaves(cfg: ModelConfig, layer: int) -> dict[str, HFLeaf]:
    """Layer `layer`'s own tensors: its MLP at its width, its slices of the per-layer inputs' packed tables."""
    P, D, L, Vp = cfg.per_layer_input_size, cfg.hidden_size, cfg.num_layers, cfg.gemma3n.per_layer_vocab
    return {
        **mlp_hf_leaves(D, cfg.layer_intermediate_sizes[layer]),
        "ple_embed": HFLeaf("model.embed_tokens_per_layer.weight", "columns", (Vp, L * P), row_offset=layer * P),
        "ple_proj": HFLeaf("model.per_layer_model_projection.weight", "transpose", (L * P, D), row_offset=layer * P),
    }


def _norm(x: jax.Array, weight: jax.Array, cfg: ModelConfig) -> jax.Array:
    return rms_norm(x, weight, cfg.rms_norm_eps, scale_first=True)


def _table_rows(inputs: LayerInputs, cfg: ModelConfig) -> LayerInputs:
    """The step's inputs with tokens past the per-layer table reading row 0 (transformers' get_per_layer_inputs)."""
    tokens = inputs.tokens
    inside = (tokens >= 0) & (tokens < cfg.gemma3n.per_layer_vocab)
    return dataclasses.replace(inputs, tokens=jnp.where(inside, tokens, 0))


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Gemma3nLayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables, inputs: LayerInputs | None = None,
) -> tuple[jax.Array, Any]:
    """AltUp's predict, attention beside LAuReL and the (sparse-gated) MLP on the active stream, AltUp's correct,
    the per-layer input added to the streams past the first; x [B, T, D] on the first layer, [A, B, T, D] after."""
    layout, eps, active = cache.layout, cfg.rms_norm_eps, cfg.gemma3n.altup_active
    streams = x if lw.altup_in is None else expand(x, lw.altup_in)
    predictions = layout.constrain(predict(streams, lw, active, eps), STREAMS)
    current = predictions[active]
    normed = _norm(current, lw.attn_norm, cfg)
    out, cache = attention(cfg, normed, cache, lw, layer, positions, rope.for_layer(layer))
    h = halved(current + _norm(out, lw.post_attn_norm, cfg) + laurel(normed, lw, eps))
    mlp = sparse_mlp(_norm(h, lw.mlp_norm, cfg), lw, cfg.activation, cfg.layer_sparsity[layer])
    corrected = correct(predictions, h + _norm(mlp, lw.post_mlp_norm, cfg), lw, active, eps)
    first = corrected[active]
    if cfg.gemma3n.altup_correct_scale:
        first = first * lw.altup_scale.astype(first.dtype)
    gated = gate_product(cfg.activation, linear(first, lw.ple_gate), per_layer_input(lw, _table_rows(inputs, cfg), cfg))
    corrected = corrected.at[1:].add(_norm(linear(gated, lw.ple_out), lw.ple_post_norm, cfg))
    if lw.altup_out is not None:
        return layout.constrain(collapse(corrected, lw.altup_out), STREAMS[1:]), cache
    return layout.constrain(corrected, STREAMS), cache


FAMILY = Family("gemma3n", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                layer_hf_leaves=layer_hf_leaves)
