"""A Perceiver resampler (Idefics2's connector): a fixed set of learned latents attends to an image's rows (keys and
values from the rows and the latents themselves, padding rows masked) through `depth` pre-RMSNorm layers with a
gated MLP four times as wide, then a last RMSNorm: any number of rows in, `latents` rows out (HF's
Idefics2PerceiverResampler; its query heads share key-value heads in groups)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.norms import rms_norm
from jaxinfer.parallel.array_info import ArrayInfo


@dataclasses.dataclass(frozen=True)
class PerceiverConfig:
    """The resampler's shape (hashable: part of a static program argument)."""

    hidden_size: int
    latents: int  # rows out per image
    depth: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    activation: str  # the MLP's gate, as models/mlp names it


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PerceiverLayer:
    """One layer; projections as [in, out]."""

    latents_norm: jax.Array  # [D]
    context_norm: jax.Array  # [D]
    wq: jax.Array  # [D, H * K]
    wk: jax.Array  # [D, KV * K]
    wv: jax.Array  # [D, KV * K]
    wo: jax.Array  # [H * K, D]
    mlp_norm: jax.Array  # [D]
    w_gate: jax.Array  # [D, 4D]
    w_up: jax.Array  # [D, 4D]
    w_down: jax.Array  # [4D, D]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PerceiverWeights:
    """The learned latents, the layers, the last norm."""

    latents: jax.Array  # [L, D]
    layers: list[PerceiverLayer]
    norm: jax.Array  # [D]


def abstract_perceiver(cfg: PerceiverConfig) -> PerceiverWeights:
    """Every leaf as an ArrayInfo (replicated, as the tower's)."""
    D, Q, KV, F = cfg.hidden_size, cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, 4 * cfg.hidden_size
    vec = lambda: ArrayInfo((D,), (None,), init_value=1.0)  # noqa: E731
    mat = lambda a, b: ArrayInfo((a, b), (None, None))  # noqa: E731
    layer = lambda: PerceiverLayer(vec(), vec(), mat(D, Q), mat(D, KV), mat(D, KV), mat(Q, D), vec(),  # noqa: E731
                                   mat(D, F), mat(D, F), mat(F, D))
    return PerceiverWeights(mat(cfg.latents, D), [layer() for _ in range(cfg.depth)], vec())


def cross_attention(lw: PerceiverLayer, latents: jax.Array, context: jax.Array, key_mask: jax.Array,
                    cfg: PerceiverConfig) -> jax.Array:
    """Latents [N, L, D] attending to the context rows [N, P, D] (those key_mask [N, P] marks) and to themselves."""
    n, length, _ = latents.shape
    both = jnp.concatenate([context, latents], axis=1)
    group, K = cfg.heads // cfg.kv_heads, cfg.head_dim
    q = (latents @ lw.wq).reshape(n, length, cfg.kv_heads, group, K)
    k = (both @ lw.wk).reshape(n, -1, cfg.kv_heads, K)
    v = (both @ lw.wv).reshape(n, -1, cfg.kv_heads, K)
    scores = jnp.einsum("nlgrk,nsgk->ngrls", q, k).astype(jnp.float32) * K ** -0.5
    seen = jnp.concatenate([key_mask, jnp.ones((n, length), bool)], axis=1)
    scores = jnp.where(seen[:, None, None, None, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(latents.dtype)
    out = jnp.einsum("ngrls,nsgk->nlgrk", probs, v).reshape(n, length, cfg.heads * K)
    return out @ lw.wo


def resample(weights: PerceiverWeights, context: jax.Array, key_mask: jax.Array, cfg: PerceiverConfig) -> jax.Array:
    """[N, latents, D] rows of each image's context rows [N, P, D] (key_mask [N, P]: the rows that are the image's)."""
    x = jnp.broadcast_to(weights.latents, (context.shape[0], *weights.latents.shape)).astype(context.dtype)
    for lw in weights.layers:
        attended = cross_attention(lw, rms_norm(x, lw.latents_norm, cfg.eps), rms_norm(context, lw.context_norm,
                                                                                        cfg.eps), key_mask, cfg)
        x = x + attended
        x = x + gated_mlp(rms_norm(x, lw.mlp_norm, cfg.eps), lw.w_gate, lw.w_up, lw.w_down, cfg.activation)
    return rms_norm(x, weights.norm, cfg.eps)
