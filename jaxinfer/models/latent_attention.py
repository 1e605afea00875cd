"""DeepSeek's multi-head latent attention (MLA), over a cache of one compressed row per token.

Per token and layer the cache holds only the normed latent c (kv_lora_rank R values: kv_a_proj_with_mqa's first
part through kv_a_layernorm) and the rotated key part k_pe that every head shares (qk_rope_head_dim P), as one row
[c, k_pe]. To the caches that is one KV head of head_dim R + P (multi-query attention; the config says so:
num_kv_heads 1, head_dim R + P), and the row is written as both its key and its value: the page pools keep K and V
apart, so a row is stored twice, 2 (R + P) values a token (DeepSeek-V3: 1152, against 128 heads x (192 + 128) =
40960 for per-head K/V).

Attention runs absorbed in the latent space. Head h's key is [W_UK[h] c, k_pe] and its value W_UV[h] c (kv_b_proj's
rows), so q_nope . W_UK[h] c = (W_UK[h]^T q_nope) . c: the head's query [W_UK[h]^T q_nope, rotated q_pe] scores the
cached rows with transformers' scale (`cfg.attn_scale`), and the softmax-weighted sum of the rows' latents goes
through W_UV[h], then o_proj. The k_pe columns of the weighted sum ride along (every attention path reads keys and
values alike) and are dropped. So the one `attend` serves this layer on every path a Llama layer takes: the dense
and paged caches, the native CPU kernels, the Pallas kernels where they take the width (see `kernel_backend`).

Rotary embeddings turn the P rope dims only, in DeepSeek's adjacent pairs (`cfg.rope_interleaved`; DeepSeek-V3's
`rope_interleave` false: rotate-half); in a layer of `cfg.nope_layers` (Kimi Linear's, all) they pass unturned,
the P dims still scored and cached. The two low-rank norms take transformers' default eps, not rms_norm_eps.
Mistral 4 scales each query by Llama 4's attention temperature (`cfg.query_scale_beta`, as Ministral 3 does):
one factor per position on the whole query, so on the absorbed one alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.kernels.precision import matmul_precision
from jaxinfer.models.attention import attend
from jaxinfer.models.family import HFLeaf
from jaxinfer.models.layers import Weight, linear, linears
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import CosSin, apply_rope
from jaxinfer.models.self_attention import KV_HEADS, Q_HEADS, query_temperature
from jaxinfer.parallel.array_info import ArrayInfo

LATENT_NORM_EPS = 1e-6  # q_a_layernorm and kv_a_layernorm: transformers builds them with its default eps


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class LatentAttentionLayer:
    """A pre-norm layer's norms and latent attention; the families add their MLP's fields (N, P, R, V, Q: see
    `config.latent_attention`)."""

    attn_norm: jax.Array  # [D]
    wq: Weight  # [D, H, N + P] q_proj, or [Q, H, N + P] q_b_proj with q_lora_rank
    wkv_a: Weight  # [D, R + P] kv_a_proj_with_mqa
    kv_a_norm: jax.Array  # [R]
    w_uk: jax.Array  # [H, R, N]: kv_b_proj's key rows of each head, transposed
    w_uv: jax.Array  # [H, V, R]: its value rows
    wo: Weight  # [H, V, D]
    mlp_norm: jax.Array  # [D]
    wq_a: Weight | None = None  # [D, Q] q_a_proj (q_lora_rank only)
    q_a_norm: jax.Array | None = None  # [Q]
    head_gate: Weight | None = None  # [D, H]: each head's output times sigmoid of it (the Ling hybrid's g_proj)

    # w_uk and w_uv multiply per head (batched), not as one projection: they stay as loaded (never quantized).
    PROJECTIONS: ClassVar[dict[str, int]] = {"wq_a": 1, "wq": 1, "wkv_a": 1, "wo": 2}
    # The normed input's projections: q_a and kv_a, or without q_lora_rank (no q_a) q and kv_a. Once the first
    # pair is joined its kv_a is None, so the second stands aside.
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("wq_a", "wkv_a"), ("wq", "wkv_a"))


def latent_attention_leaves(cfg: ModelConfig) -> dict[str, ArrayInfo | None]:
    """The fields of `LatentAttentionLayer` as ArrayInfos (the q_a leaves None without q_lora_rank)."""
    mla = cfg.latent_attention
    D, H, Q, R = cfg.hidden_size, cfg.num_heads, mla.q_lora_rank, mla.kv_lora_rank
    N, P, V = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
    return dict(
        attn_norm=ArrayInfo((D,), ("embed",), init_value=1.0),
        mlp_norm=ArrayInfo((D,), ("embed",), init_value=1.0),
        wq_a=ArrayInfo((D, Q), ("embed", None)) if Q else None,
        q_a_norm=ArrayInfo((Q,), (None,), init_value=1.0) if Q else None,
        wq=ArrayInfo((Q or D, H, N + P), (None if Q else "embed", "q_heads", "head_dim")),
        # The latent and k_pe are every head's: replicated over tp, like the one cached "KV head".
        wkv_a=ArrayInfo((D, R + P), ("embed", None)),
        kv_a_norm=ArrayInfo((R,), (None,), init_value=1.0),
        w_uk=ArrayInfo((H, R, N), ("q_heads", None, "head_dim")),
        w_uv=ArrayInfo((H, V, R), ("q_heads", "head_dim", None)),
        wo=ArrayInfo((H, V, D), ("q_heads", "head_dim", "embed")),
    )


def latent_attention_hf_leaves(cfg: ModelConfig, prefix: str = "model.layers.{i}.self_attn.") -> dict[str, HFLeaf]:
    """Where the attention fields live: q_proj or q_a_proj/q_a_layernorm/q_b_proj, kv_a_proj_with_mqa,
    kv_a_layernorm, kv_b_proj (each head's N key rows, then its V value rows) and o_proj."""
    mla = cfg.latent_attention
    D, H, Q, R = cfg.hidden_size, cfg.num_heads, mla.q_lora_rank, mla.kv_lora_rank
    N, P, V = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
    kv_b = (H * (N + V), R)
    leaves = {
        "wkv_a": HFLeaf(prefix + "kv_a_proj_with_mqa.weight", "transpose", (R + P, D)),
        "kv_a_norm": HFLeaf(prefix + "kv_a_layernorm.weight", "same", (R,)),
        "w_uk": HFLeaf(prefix + "kv_b_proj.weight", "head_rows_transposed", kv_b, H, N),
        "w_uv": HFLeaf(prefix + "kv_b_proj.weight", "head_rows", kv_b, H, V, row_offset=N),
        "wo": HFLeaf(prefix + "o_proj.weight", "out_heads", (D, H * V), H, V),
    }
    if not Q:
        return {**leaves, "wq": HFLeaf(prefix + "q_proj.weight", "in_heads", (H * (N + P), D), H, N + P)}
    return {
        **leaves,
        "wq_a": HFLeaf(prefix + "q_a_proj.weight", "transpose", (Q, D)),
        "q_a_norm": HFLeaf(prefix + "q_a_layernorm.weight", "same", (Q,)),
        "wq": HFLeaf(prefix + "q_b_proj.weight", "in_heads", (H * (N + P), Q), H, N + P),
    }


def per_head(x: jax.Array, w: jax.Array, subscripts: str) -> jax.Array:
    """x [B, T, H, a] times each head's own matrix of w [H, b, a] (the contracted axis last in both: XLA:CPU has
    no bf16 dot with float32 results for the others), accumulated in float32, in x's dtype."""
    w = w.astype(x.dtype)
    out = jnp.einsum(subscripts, x, w, precision=matmul_precision(x, w), preferred_element_type=jnp.float32)
    return out.astype(x.dtype)


def latent_projections(
    h: jax.Array, lw: LatentAttentionLayer, cfg: ModelConfig,
) -> tuple[jax.Array | None, jax.Array, jax.Array]:
    """The normed low-rank query [B, T, Q] (None without q_lora_rank; DeepSeek-V3.2's indexer reads it too), the
    query [B, T, H, N + P] and kv_a_proj_with_mqa's output [B, T, R + P]."""
    if not cfg.latent_attention.q_lora_rank:
        q, kv = linears(h, [lw.wq, lw.wkv_a])
        return None, q, kv
    q_low, kv = linears(h, [lw.wq_a, lw.wkv_a])
    q_low = rms_norm(q_low, lw.q_a_norm, LATENT_NORM_EPS)
    q, scale = linear(q_low, lw.wq), cfg.latent_attention.q_scale
    return q_low, (q if scale == 1.0 else q * jnp.asarray(scale, q.dtype)), kv


def latent_rows(
    q: jax.Array, kv: jax.Array, lw: LatentAttentionLayer, cfg: ModelConfig, rope: CosSin | None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q_nope [B, T, H, N], rotated q_pe [B, T, H, P] and the cache row [B, T, 1, R + P] ([c, rotated k_pe]); with
    no rope (a NoPE layer: Kimi Linear's) q_pe and k_pe pass unturned."""
    mla = cfg.latent_attention
    R, N = mla.kv_lora_rank, mla.qk_nope_head_dim
    latent = rms_norm(kv[..., :R], lw.kv_a_norm, LATENT_NORM_EPS)
    if mla.latent_scale != 1.0:  # LongCat-Flash's: keys and values both read the scaled latent
        latent = latent * jnp.asarray(mla.latent_scale, latent.dtype)
    q_pe, k_pe = q[..., N:], kv[..., None, R:]
    if rope is not None:
        q_pe, k_pe = (apply_rope(x, *rope, cfg.rope_interleaved) for x in (q_pe, k_pe))
    return q[..., :N], q_pe, jnp.concatenate([latent[..., None, :], k_pe], axis=-1)


def latent_attention(
    cfg: ModelConfig, h: jax.Array, cache: Any, lw: LatentAttentionLayer, layer: int, positions: jax.Array,
    rope: CosSin | None,
) -> tuple[jax.Array, Any]:
    """Attention of the normed input h [B, T, D] over the cache after writing this step's rows: [B, T, D]."""
    layout = cache.layout
    _, q, kv = latent_projections(h, lw, cfg)
    q_nope, q_pe, row = latent_rows(q, kv, lw, cfg, rope)
    row = layout.constrain(row, KV_HEADS)
    cache = cache.write(layer, row, row, positions)
    q_latent = per_head(layout.constrain(q_nope, Q_HEADS), lw.w_uk, "bthn,hrn->bthr")
    q = layout.constrain(jnp.concatenate([q_latent, q_pe], axis=-1), Q_HEADS)
    if cfg.query_scale_beta:
        q = q * query_temperature(positions, cfg.query_scale_beta, cfg.query_scale_period).astype(q.dtype)
    weighted = attend(q, cache, layer, positions, cfg.layer_windows[layer], scale=cfg.attn_scale)
    heads = per_head(weighted[..., : cfg.latent_attention.kv_lora_rank], lw.w_uv, "bthr,hvr->bthv")
    if lw.head_gate is not None:
        heads = heads * jax.nn.sigmoid(linear(h, lw.head_gate).astype(jnp.float32)).astype(heads.dtype)[..., None]
    return linear(layout.constrain(heads, Q_HEADS), lw.wo, contract=2), cache
