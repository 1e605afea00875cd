"""EAGLE draft heads: one decoder layer over the target's features and the next token's embedding.

EAGLE-1 (Li et al., 2024): the feature f_i is the target's final (post-norm) hidden state at
position i. At position i the head reads x = fc([embed(t_{i+1}); f_i]) and its layer (no input
norm) predicts f_{i+1}; the target's own LM head turns that into the distribution of t_{i+2}, and
the prediction is the next step's feature. EAGLE-3: the feature is fc over the residual stream
entering three target layers (low, middle, high); the layer normalises the embedding and the
feature apart and attends over their concatenation [2D]; its output (before `norm`) is the next
feature, and `norm` + its own LM head over a reduced draft vocabulary give the logits (draft id
d is target id d + d2t[d]). Both read the target's embedding, never a copy of their own.
A model's own multi-token-prediction layer (version MTP, `speculative.mtp`) is run as a head too: the
feature is the target's final hidden state before its final norm (the residual stream leaving its last
layer, tapped as EAGLE-3's are).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.cache.contiguous import KVCache
from jaxinfer.config.model import ModelConfig
from jaxinfer.kernels.cpu import pack_weight, packing_applies
from jaxinfer.models import LayerWeights, Weights
from jaxinfer.models.attention import attend, dense_attention
from jaxinfer.models.decoder import finish_logits
from jaxinfer.models.layers import Weight, linear, linear_transposed, linears
from jaxinfer.models.llama import PROJECTIONS
from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import apply_rope, rope_cos_sin
from jaxinfer.models.row_table import take_rows
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.speculative.mtp import MtpWeights, mtp_logits, mtp_step

MTP = "mtp"  # a model's own multi-token-prediction layer (`speculative.mtp`)
VERSIONS = (1, 3, MTP)


@dataclasses.dataclass(frozen=True)
class EagleConfig:
    """Shape of an EAGLE head; hashable (a static argument of the compiled loop)."""

    layer: ModelConfig  # the head's one decoder layer (heads, MLP, rope, eps); vocab_size = the target's
    version: int | str  # 1, 3 or MTP
    fc_bias: bool = False  # EAGLE-1 heads from the reference code have one
    draft_vocab: int = 0  # EAGLE-3: size of its own LM head's vocabulary
    # EAGLE-3: target layers whose input residual stream is read; MTP: (the target's num_layers,), what leaves its last
    feature_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.version not in VERSIONS:
            raise ValueError(f"EAGLE version must be one of {VERSIONS}, got {self.version}")
        if self.version == 3 and (self.draft_vocab < 1 or len(self.feature_layers) != 3):
            raise ValueError(
                f"an EAGLE-3 head needs draft_vocab >= 1 and 3 feature layers, got {self.draft_vocab} "
                f"and {self.feature_layers}"
            )

    @property
    def feature_size(self) -> int:
        """Width of the target features the head reads: D (EAGLE-1) or 3 D (EAGLE-3)."""
        return self.layer.hidden_size * (3 if self.version == 3 else 1)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class EagleWeights:
    """The head's own weights (the target's embedding and, for EAGLE-1, LM head are not copied)."""

    fc: Weight  # [2D, D] EAGLE-1 over [embedding; feature], [3D, D] EAGLE-3 over the target features
    # attn_norm: EAGLE-3's norm of the embedding, None for EAGLE-1; wq/wk/wv [A, H, K], A = D or 2D.
    layer: LayerWeights
    fc_bias: jax.Array | None = None  # [D]
    hidden_norm: jax.Array | None = None  # [D] EAGLE-3: norm of the feature
    norm: jax.Array | None = None  # [D] EAGLE-3: before its LM head
    lm_head: Weight | None = None  # [D, V_draft] EAGLE-3
    d2t: jax.Array | None = None  # [V_draft] int32 EAGLE-3: target id minus draft id


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class EagleParams:
    """What the compiled loop hands the head: its weights and the target's embedding and LM head, with
    what the target's head adds to its product (`eagle_params` copies them from the target)."""

    head: EagleWeights | MtpWeights
    embed: jax.Array  # [V, D] the target's
    lm_head: Weight | None  # [D, V] the target's (None: tied to embed)
    lm_head_bias: jax.Array | None = None  # [V] the target's (Phi, GPT-J)
    logits_scaling: float = dataclasses.field(default=1.0, metadata=dict(static=True))  # Granite, Cohere
    logit_soft_cap: float | None = dataclasses.field(default=None, metadata=dict(static=True))  # Gemma 2 and 3


def eagle_params(head: EagleWeights | MtpWeights, target: Weights) -> EagleParams:
    """A head with the target's embedding and output head, bias, scaling and soft cap included."""
    if target.logit_scale is not None:
        raise ValueError("EAGLE and MTP heads are not supported for a target whose output head scales each token's "
                         "logit (Dory's logit_scale): the head would draft from unscaled logits")
    return EagleParams(head, target.embed, target.lm_head, target.lm_head_bias, target.logits_scaling,
                       target.logit_soft_cap)


def abstract_eagle(ecfg: EagleConfig) -> EagleWeights:
    """Every leaf of a head as an ArrayInfo (d2t, an integer table, is loaded, never initialised)."""
    cfg = ecfg.layer
    D, F, H, KV, K = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    three = ecfg.version == 3
    A = 2 * D if three else D
    norm = lambda: ArrayInfo((D,), ("embed",), init_value=1.0)  # noqa: E731
    layer = LayerWeights(
        attn_norm=norm() if three else None,
        wq=ArrayInfo((A, H, K), ("embed", "q_heads", "head_dim")),
        wk=ArrayInfo((A, KV, K), ("embed", "kv_heads", "head_dim")),
        wv=ArrayInfo((A, KV, K), ("embed", "kv_heads", "head_dim")),
        wo=ArrayInfo((H, K, D), ("q_heads", "head_dim", "embed")),
        mlp_norm=norm(),
        w_gate=ArrayInfo((D, F), ("embed", "mlp")),
        w_up=ArrayInfo((D, F), ("embed", "mlp")),
        w_down=ArrayInfo((F, D), ("mlp", "embed")),
    )
    return EagleWeights(
        fc=ArrayInfo((ecfg.feature_size if three else 2 * D, D), (None, "embed")),
        layer=layer,
        fc_bias=ArrayInfo((D,), ("embed",), init_value=0.0) if ecfg.fc_bias else None,
        hidden_norm=norm() if three else None,
        norm=norm() if three else None,
        lm_head=ArrayInfo((D, ecfg.draft_vocab), ("embed", "vocab")) if three else None,
        d2t=ArrayInfo((ecfg.draft_vocab,), (None,), init_value=0.0) if three else None,
    )


def init_eagle(ecfg: EagleConfig, key: jax.Array, dtype: jnp.dtype) -> EagleWeights:
    """A random head (normal noise, constant norms; d2t zeros, the identity map)."""
    abstract = abstract_eagle(ecfg)
    leaves, treedef = jax.tree.flatten(abstract, is_leaf=lambda x: isinstance(x, ArrayInfo))
    keys = jax.random.split(key, len(leaves))

    def make(info: ArrayInfo, k: jax.Array) -> jax.Array:
        if info.init_value is not None:
            return jnp.full(info.shape, info.init_value, dtype)
        return (info.init_std * jax.random.normal(k, info.shape, jnp.float32)).astype(dtype)

    weights = jax.tree.unflatten(treedef, [make(i, k) for i, k in zip(leaves, keys)])
    if weights.d2t is not None:
        weights = dataclasses.replace(weights, d2t=jnp.zeros(weights.d2t.shape, jnp.int32))
    return weights


def pack_eagle(head: EagleWeights) -> EagleWeights:
    """The head's matrices in the CPU kernel's layout (bf16 only; others as they are), as the target's are."""
    if not packing_applies(head.fc.dtype):
        return head
    packed = {name: pack_weight(getattr(head.layer, name), contract) for name, contract in PROJECTIONS.items()}
    layer = dataclasses.replace(head.layer, **packed)
    lm_head = None if head.lm_head is None else pack_weight(head.lm_head)
    return dataclasses.replace(head, fc=pack_weight(head.fc), layer=layer, lm_head=lm_head)


def project_features(params: EagleParams, features: jax.Array, ecfg: EagleConfig) -> jax.Array:
    """Target features [..., F] as the head's input feature [..., D] (EAGLE-3's fc; EAGLE-1 and MTP read them as they
    are)."""
    if ecfg.version == 3:
        return linear(features, params.head.fc)
    return features


def head_step(
    params: EagleParams, tokens: jax.Array, features: jax.Array, positions: jax.Array, cache: KVCache,
    ecfg: EagleConfig,
) -> tuple[jax.Array, KVCache]:
    """The head at positions [B, T] (i) reading tokens [B, T] (t_{i+1}) and features [B, T, D] (f_i).

    Returns the predicted features [B, T, D] (f_{i+1}, before EAGLE-3's norm) and the cache.
    """
    if ecfg.version == MTP:
        return mtp_step(params, tokens, features, positions, cache, ecfg.layer)
    x, q, k, v = _head_qkv(params, tokens, features, positions, ecfg)
    cache = cache.write(0, k, v, positions)
    return _head_output(params, x, attend(q, cache, 0, positions, 0), ecfg), cache


def chained_head_step(
    params: EagleParams, tokens: jax.Array, features: jax.Array, positions: jax.Array, cache: KVCache,
    ecfg: EagleConfig,
) -> jax.Array:
    """The head at every position p of positions [B, T] at once, as a draft chain's later step runs it
    there: reading tokens [B, T] and features [B, T, D] (the head's own earlier output), attending
    to the cache's entries before p (those the target's features wrote) and to its own key only.
    What `head_step` at p alone over that cache gives; for training on the head's own outputs
    (EAGLE-3's training-time test). Returns the predicted features [B, T, D]."""
    if ecfg.version == MTP:
        raise ValueError("chained_head_step trains EAGLE heads; an MTP layer is trained with its model")
    x, q, k, v = _head_qkv(params, tokens, features, positions, ecfg)
    keys = jnp.concatenate([cache.k[0].astype(k.dtype), k.transpose(0, 2, 1, 3)], axis=2)  # [B, KV, S + T, K]
    values = jnp.concatenate([cache.v[0].astype(v.dtype), v.transpose(0, 2, 3, 1)], axis=3)  # [B, KV, K, S + T]
    batch, steps = positions.shape
    before = jnp.arange(cache.k[0].shape[2])[None, None, :] < positions[:, :, None]
    own = jnp.broadcast_to(jnp.eye(steps, dtype=bool)[None], (batch, steps, steps))
    return _head_output(params, x, dense_attention(q, keys, values, jnp.concatenate([before, own], axis=-1)), ecfg)


def _head_qkv(
    params: EagleParams, tokens: jax.Array, features: jax.Array, positions: jax.Array, ecfg: EagleConfig
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """The head layer's residual input x [B, T, D] and its rotated q, k and v for (tokens, features)."""
    cfg, w = ecfg.layer, params.head
    lw = w.layer
    embeds = take_rows(params.embed, tokens).astype(features.dtype)
    if ecfg.version == 1:
        x = linear(jnp.concatenate([embeds, features], axis=-1), w.fc)
        x = x if w.fc_bias is None else x + w.fc_bias
        h = x  # no input norm: the fc output goes straight to attention, as EAGLE-1 trained it
    else:
        x = features
        normed = rms_norm(embeds, lw.attn_norm, cfg.rms_norm_eps), rms_norm(x, w.hidden_norm, cfg.rms_norm_eps)
        h = jnp.concatenate(normed, axis=-1)
    cos, sin = rope_cos_sin(positions, cfg)
    q, k, v = linears(h, [lw.wq, lw.wk, lw.wv])
    return x, apply_rope(q, cos, sin, cfg.rope_interleaved), apply_rope(k, cos, sin, cfg.rope_interleaved), v


def _head_output(params: EagleParams, x: jax.Array, attention: jax.Array, ecfg: EagleConfig) -> jax.Array:
    """The head layer's output from its residual input and attention: projection, then the MLP."""
    lw, cfg = params.head.layer, ecfg.layer
    x = x + linear(attention, lw.wo, contract=2)
    mlp_in = rms_norm(x, lw.mlp_norm, cfg.rms_norm_eps)
    return x + gated_mlp(mlp_in, lw.w_gate, lw.w_up, lw.w_down, cfg.activation)


def head_logits(params: EagleParams, predicted: jax.Array, ecfg: EagleConfig) -> jax.Array:
    """Float32 logits [..., V_target] of predicted features [..., D]; outside EAGLE-3's draft vocabulary -inf."""
    if ecfg.version == MTP:
        return mtp_logits(params, predicted, ecfg.layer)
    if ecfg.version == 1:
        if params.lm_head is None:
            logits = linear_transposed(predicted, params.embed)
        else:
            logits = linear(predicted, params.lm_head, out_dtype=jnp.float32)
        return finish_logits(logits, params.lm_head_bias, params.logits_scaling, params.logit_soft_cap)
    w = params.head
    draft = linear(rms_norm(predicted, w.norm, ecfg.layer.rms_norm_eps), w.lm_head, out_dtype=jnp.float32)
    target_ids = jnp.arange(ecfg.draft_vocab, dtype=jnp.int32) + w.d2t
    full = jnp.full((*draft.shape[:-1], ecfg.layer.vocab_size), -jnp.inf, jnp.float32)
    return full.at[..., target_ids].set(draft)
