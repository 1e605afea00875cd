"""Gemma 4 (text): Gemma4ForCausalLM, and Gemma4ForConditionalGeneration's language model run text-only.

Gemma 3's sandwich layer (a norm before and after attention and the MLP; sliding and global layers by
`layer_types`; q/k norms; scaled embeddings; the output soft cap if set), with transformers' Gemma 4 changes:
- RMSNorms scale by w (not 1 + w) in float32 before the cast; values are RMS-normed without a weight (v_norm);
  scores are not scaled (`scaling = 1.0`);
- each layer its own kv heads and head dim (the global layers' wider, `cfg.kv_shape`); the global layers rotate
  with the proportional rope; under `attention_k_eq_v` they have no v_proj: values are the raw keys;
- KV sharing: the last `num_kv_shared_layers` layers have no k/v projections and attend over the K/V of the
  last earlier layer of their type (`cfg.kv_source`); they keep no pages (`layer_calls` hands them the store
  layer's);
- per-layer inputs (PLE): layer i adds norm(W_out(gelu(W_gate x) * p_i)), p_i = (norm(e @ P_i / sqrt(D)) +
  E_i[token] * sqrt(P)) / sqrt(2) of the input embeddings e and the token (`LayerInputs`; each layer holds its
  slices of the packed [V, L * P] table and [L * P, D] projection);
- the MoE block (`enable_moe_block`): beside the dense MLP, experts on the pre-MLP residual, routed by a normed,
  scaled router (softmax, top k renormalised, times `per_expert_scale`), each branch normed before the sum;
- the layer's output times its `layer_scalar`;
- with images (models/gemma4_vision), an image's tokens see each other both ways on the sliding layers only.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.attention import attend
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.gemma4_config import read_config
from jaxinfer.models.grouped_matmul import Experts
from jaxinfer.models.joined_weight import JoinedWeight
from jaxinfer.models.layer_calls import LayerInputs
from jaxinfer.models.layers import Weight, linear, linears
from jaxinfer.models.mlp import gate_product, gated_mlp, mlp_hf_leaves, mlp_leaves
from jaxinfer.models.moe import DOWN_AXES, GATE_AXES, ROUTER_AXES, experts_output
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import CosSin, RopeTables, apply_rope
from jaxinfer.models.self_attention import HIDDEN, KV_HEADS, Q_HEADS
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration")
LAYER = "model.layers.{i}."
NORMS = {"attn_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm",
         "mlp_norm": "pre_feedforward_layernorm", "post_mlp_norm": "post_feedforward_layernorm"}
MOE_NORMS = {"post_dense_norm": "post_feedforward_layernorm_1", "pre_moe_norm": "pre_feedforward_layernorm_2",
             "post_moe_norm": "post_feedforward_layernorm_2"}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Gemma4LayerWeights:
    """One Gemma 4 layer; a KV-sharing layer has no wk, wv, k_norm; a global layer under k_eq_v no wv."""

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
    layer_scalar: jax.Array  # [1]
    wk: Weight | None = None  # [D, KV, K]
    wv: Weight | None = None  # [D, KV, K]
    k_norm: jax.Array | None = None  # [K]
    # per-layer inputs: this layer's slices of the packed tables, and its gate, projection and norm
    ple_embed: jax.Array | None = None  # [V, P]
    ple_proj: jax.Array | None = None  # [D, P]
    ple_norm: jax.Array | None = None  # [P] (every layer's copy of the one per_layer_projection_norm)
    ple_gate: Weight | None = None  # [D, P]
    ple_out: Weight | None = None  # [P, D]
    ple_post_norm: jax.Array | None = None  # [D]
    # the MoE block
    router: jax.Array | None = None  # [D, E]
    router_scale: jax.Array | None = None  # [D]
    expert_scale: jax.Array | None = None  # [E]
    moe_gate: Experts | None = None  # [E, D, F]
    moe_up: Experts | None = None  # [E, D, F]
    moe_down: Experts | None = None  # [E, F, D]
    post_dense_norm: jax.Array | None = None  # [D]
    pre_moe_norm: jax.Array | None = None  # [D]
    post_moe_norm: jax.Array | None = None  # [D]

    PROJECTIONS: ClassVar[dict[str, int]] = {"wq": 1, "wk": 1, "wv": 1, "wo": 2, "w_gate": 1, "w_up": 1, "w_down": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("wq", "wk", "wv"), ("w_gate", "w_up"))
    EXPERTS: ClassVar[tuple[str, ...]] = ("moe_gate", "moe_up", "moe_down")


def abstract_layer(cfg: ModelConfig, layer: int) -> Gemma4LayerWeights:
    """Layer `layer`'s leaves as ArrayInfos (norm weights start at 1: Gemma 4 scales by w itself)."""
    D, H, E, P = cfg.hidden_size, cfg.num_heads, cfg.num_experts, cfg.per_layer_input_size
    KV, K = cfg.kv_shape(layer)
    F = cfg.layer_intermediate_sizes[layer] if cfg.layer_intermediate_sizes else cfg.intermediate_size
    norm = lambda n, axes=("embed",): ArrayInfo((n,), axes, init_value=1.0)  # noqa: E731
    leaves: dict[str, Any] = dict(
        **{name: norm(D) for name in NORMS}, **mlp_leaves(D, F),
        wq=ArrayInfo((D, H, K), ("embed", "q_heads", "head_dim")),
        wo=ArrayInfo((H, K, D), ("q_heads", "head_dim", "embed")),
        q_norm=norm(K, ("head_dim",)), layer_scalar=norm(1, (None,)),
    )
    if cfg.kv_source(layer) == layer:  # a KV-sharing layer has no k/v projections
        kv = ArrayInfo((D, KV, K), ("embed", "kv_heads", "head_dim"))
        leaves.update(wk=kv, wv=None if layer in cfg.values_from_keys else kv, k_norm=norm(K, ("head_dim",)))
    if P:
        leaves.update(ple_embed=ArrayInfo((cfg.vocab_size, P), ("vocab", None)),
                      ple_proj=ArrayInfo((D, P), ("embed", None)), ple_norm=norm(P, (None,)),
                      ple_gate=ArrayInfo((D, P), ("embed", None)), ple_out=ArrayInfo((P, D), (None, "embed")),
                      ple_post_norm=norm(D))
    if E:
        G = cfg.moe_intermediate_size
        leaves.update(router=ArrayInfo((D, E), ROUTER_AXES), router_scale=norm(D), expert_scale=norm(E, (None,)),
                      moe_gate=ArrayInfo((E, D, G), GATE_AXES), moe_up=ArrayInfo((E, D, G), GATE_AXES),
                      moe_down=ArrayInfo((E, G, D), DOWN_AXES), **{name: norm(D) for name in MOE_NORMS})
    return Gemma4LayerWeights(**leaves)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives, at layer 0's shapes (`layer_hf_leaves` gives the layers that differ)."""
    return {**_shaped_leaves(cfg, 0), **_moe_hf_leaves(cfg)}


def layer_hf_leaves(cfg: ModelConfig, layer: int) -> dict[str, HFLeaf]:
    """Layer `layer`'s fields whose tensors differ from `hf_leaves`': its attention and MLP shapes, and its slices
    of the per-layer inputs' packed tables."""
    P, V, D = cfg.per_layer_input_size, cfg.vocab_size, cfg.hidden_size
    every = _shaped_leaves(cfg, 0)
    own = {name: leaf for name, leaf in _shaped_leaves(cfg, layer).items() if every[name] != leaf}
    if P:
        own["ple_embed"] = HFLeaf("model.embed_tokens_per_layer.weight", "columns", (V, cfg.num_layers * P),
                                  row_offset=layer * P)
        own["ple_proj"] = HFLeaf("model.per_layer_model_projection.weight", "transpose", (cfg.num_layers * P, D),
                                 row_offset=layer * P)
    return own


def _shaped_leaves(cfg: ModelConfig, layer: int) -> dict[str, HFLeaf]:
    """The fields whose HF shapes follow the layer's kv heads, head dim and MLP width."""
    D, H, P = cfg.hidden_size, cfg.num_heads, cfg.per_layer_input_size
    KV, K = cfg.kv_shape(layer)
    F = cfg.layer_intermediate_sizes[layer] if cfg.layer_intermediate_sizes else cfg.intermediate_size
    attn = LAYER + "self_attn."
    leaves = {
        **{name: HFLeaf(f"{LAYER}{hf}.weight", "same", (D,)) for name, hf in NORMS.items()},
        **mlp_hf_leaves(D, F),
        "wq": HFLeaf(attn + "q_proj.weight", "in_heads", (H * K, D), H, K),
        "wk": HFLeaf(attn + "k_proj.weight", "in_heads", (KV * K, D), KV, K),
        "wv": HFLeaf(attn + "v_proj.weight", "in_heads", (KV * K, D), KV, K),
        "wo": HFLeaf(attn + "o_proj.weight", "out_heads", (D, H * K), H, K),
        "q_norm": HFLeaf(attn + "q_norm.weight", "same", (K,)),
        "k_norm": HFLeaf(attn + "k_norm.weight", "same", (K,)),
        "layer_scalar": HFLeaf(LAYER + "layer_scalar", "same", (1,)),
    }
    if P:
        leaves.update(ple_norm=HFLeaf("model.per_layer_projection_norm.weight", "same", (P,)),
                      ple_gate=HFLeaf(LAYER + "per_layer_input_gate.weight", "transpose", (P, D)),
                      ple_out=HFLeaf(LAYER + "per_layer_projection.weight", "transpose", (D, P)),
                      ple_post_norm=HFLeaf(LAYER + "post_per_layer_input_norm.weight", "same", (D,)))
    return leaves


def _moe_hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """The MoE block's tensors: the router's, the experts' (gate and up fused as [E, 2F, D]) and the norms."""
    D, E, G = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    if not E:
        return {}
    experts = LAYER + "experts."
    return {
        "router": HFLeaf(LAYER + "router.proj.weight", "transpose", (E, D)),
        "router_scale": HFLeaf(LAYER + "router.scale", "same", (D,)),
        "expert_scale": HFLeaf(LAYER + "router.per_expert_scale", "same", (E,)),
        "moe_gate": HFLeaf(experts + "gate_up_proj", "transpose", (E, 2 * G, D)),
        "moe_up": HFLeaf(experts + "gate_up_proj", "transpose", (E, 2 * G, D), row_offset=G),
        "moe_down": HFLeaf(experts + "down_proj", "transpose", (E, D, G)),
        **{name: HFLeaf(f"{LAYER}{hf}.weight", "same", (D,)) for name, hf in MOE_NORMS.items()},
    }


def _norm(x: jax.Array, weight: jax.Array, cfg: ModelConfig) -> jax.Array:
    return rms_norm(x, weight, cfg.rms_norm_eps, scale_first=True)


def _unit_norm(x: jax.Array, eps: float) -> jax.Array:
    """RMSNorm without a weight (v_norm, the router's norm), in float32 then cast."""
    return rms_norm(x, jnp.ones((), jnp.float32), eps, scale_first=True)


def _project(h: jax.Array, lw: Gemma4LayerWeights) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q, k, v [B, T, heads, K] before norms; v the raw keys where the layer has no v_proj."""
    if lw.wv is None and not isinstance(lw.wq, JoinedWeight):
        q, k = linears(h, [lw.wq, lw.wk])
        return q, k, k
    return tuple(linears(h, [lw.wq, lw.wk, lw.wv]))


def attention(cfg: ModelConfig, h: jax.Array, cache: Any, lw: Gemma4LayerWeights, layer: int,
              positions: jax.Array, rope: CosSin) -> tuple[jax.Array, Any]:
    """Attention of the normed input h [B, T, D]; a KV-sharing layer (no k_norm) writes nothing and reads its
    store layer's K/V (`cfg.kv_source`; `layer_calls` hands it those buffers as its own)."""
    layout, eps = cache.layout, cfg.rms_norm_eps
    if lw.k_norm is None:
        q = linear(h, lw.wq)
    else:
        q, k, v = _project(h, lw)
        k = apply_rope(_norm(layout.constrain(k, KV_HEADS), lw.k_norm, cfg), *rope)
        cache = cache.write(layer, k, _unit_norm(v, eps), positions)
    q = apply_rope(_norm(layout.constrain(q, Q_HEADS), lw.q_norm, cfg), *rope)
    window = cfg.layer_windows[layer]
    attn = attend(q, cache if window else causal(cache), cfg.kv_source(layer), positions, window, scale=cfg.attn_scale)
    return linear(layout.constrain(attn, Q_HEADS), lw.wo, contract=2), cache


def causal(cache: Any) -> Any:
    """The cache as a global layer attends over it: an image's tokens see their image both ways on the sliding
    layers only (`key_ends`: HF's create_masks_for_vision_model keeps the full-attention layers causal)."""
    return dataclasses.replace(cache, key_ends=None) if getattr(cache, "key_ends", None) is not None else cache


def per_layer_input(lw: Gemma4LayerWeights, inputs: LayerInputs, cfg: ModelConfig) -> jax.Array:
    """This layer's per-layer input [B, T, P] (transformers' `project_per_layer_inputs` slice i)."""
    dtype = inputs.embeds.dtype
    token_part = jnp.take(lw.ple_embed, inputs.tokens, axis=0) * jnp.asarray(
        math.sqrt(cfg.per_layer_input_size), lw.ple_embed.dtype)
    context = linear(inputs.embeds, lw.ple_proj) * jnp.asarray(cfg.hidden_size ** -0.5, dtype)
    return (_norm(context, lw.ple_norm, cfg) + token_part.astype(dtype)) * jnp.asarray(2 ** -0.5, dtype)


def route(x: jax.Array, lw: Gemma4LayerWeights, cfg: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """Routing weights [N, k] (float32) and experts [N, k] of rows x [N, D] (Gemma4TextRouter)."""
    scaled = _unit_norm(x, cfg.rms_norm_eps) * lw.router_scale.astype(x.dtype) * jnp.asarray(
        cfg.hidden_size ** -0.5, x.dtype)
    probs = jax.nn.softmax(linear(scaled, lw.router).astype(jnp.float32), axis=-1)
    weights, experts = jax.lax.top_k(probs, cfg.experts_per_token)
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights * lw.expert_scale.astype(jnp.float32)[experts], experts


def moe_branch(x: jax.Array, lw: Gemma4LayerWeights, cfg: ModelConfig, layout: Layout) -> jax.Array:
    """The experts' output [B, T, D] for the pre-MLP residual x, routed on x, run on its pre_moe_norm."""
    rows = x.reshape(-1, x.shape[-1])
    weights, experts = route(rows, lw, cfg)
    normed = _norm(rows, lw.pre_moe_norm, cfg)
    out = experts_output(normed, weights, experts, lw, layout, cfg.activation)
    return out.astype(x.dtype).reshape(x.shape)


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Gemma4LayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables, inputs: LayerInputs | None = None,
) -> tuple[jax.Array, Any]:
    """Sandwich-normed attention, the dense MLP (plus the MoE branch), the per-layer input, times layer_scalar."""
    layout = cache.layout
    out, cache = attention(cfg, _norm(x, lw.attn_norm, cfg), cache, lw, layer, positions, rope.for_layer(layer))
    x = layout.constrain(x + _norm(out, lw.post_attn_norm, cfg), HIDDEN)
    h = gated_mlp(_norm(x, lw.mlp_norm, cfg), lw.w_gate, lw.w_up, lw.w_down, cfg.activation)
    if lw.router is not None:
        h = _norm(h, lw.post_dense_norm, cfg) + _norm(moe_branch(x, lw, cfg, layout), lw.post_moe_norm, cfg)
    x = layout.constrain(x + _norm(h, lw.post_mlp_norm, cfg), HIDDEN)
    if lw.ple_gate is not None:
        gated = gate_product(cfg.activation, linear(x, lw.ple_gate), per_layer_input(lw, inputs, cfg))
        x = x + _norm(linear(gated, lw.ple_out), lw.ple_post_norm, cfg)
    return layout.constrain(x * lw.layer_scalar.astype(x.dtype), HIDDEN), cache


FAMILY = Family("gemma4", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                layer_hf_leaves=layer_hf_leaves)
