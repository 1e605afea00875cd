"""SK Telecom A.X-K2 (AXK2ForCausalLM): DeepSeek-V3.2's sparse-attention model with gated norms and a gated query.

As transformers' modeling_axk2 has it (its modular file builds it from DeepSeek-V3.2's modules):

- Each layer is DeepSeek-V3.2's (models.deepseek_v32: latent attention over the `index_topk` rows the lightning
  indexer picks, its rope in adjacent pairs, the indexer's rotate-half), dense or sparse by `mlp_layer_types` (by
  default from the legacy `first_k_dense_replace` (1) and `moe_layer_freq` (1), as A.X-K1's: `axk1.dense_layers`).
- The query is one product over [normed q_a, raw q_a] (2 x `q_lora_rank` wide): per head its N + P query dims, then
  V gate dims, the output of each head times sigmoid(gate) before o_proj. The hub stores it as `q_b_proj` rows
  [H x (N + P + V), 2Q], read as the two leaves `wq`, `attn_gate` (`HFLeaf` kind `in_head_rows`).
- `input_layernorm` of every layer, and `post_attention_layernorm` of the sparse ones, is an RMSNorm whose output y
  is gated by sigmoid(W_up silu(W_down y)), W_down `gated_norm_rank` wide (`gated_norm`).
- Routing is DeepSeek-V3's noaux_tc (sigmoid scores plus `e_score_correction_bias` to choose, renormalised, times
  `routed_scaling_factor`) over all experts where `n_group` is null (A.X-K2-Light's default), within groups where
  `n_group` and `topk_group` are set (the larger releases).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.latent_attention import LightningIndexer
from jaxinfer.config.model import ConfigError, ModelConfig, field
from jaxinfer.models.axk1 import dense_layers
from jaxinfer.models.deepseek import KEPT_NULL, V3, DeepseekMoELayerWeights, moe_mlp
from jaxinfer.models.deepseek import read_config as v3_config
from jaxinfer.models.deepseek_v32 import DsaLayerWeights, DsaMoELayerWeights
from jaxinfer.models.deepseek_v32 import abstract_layer as dsa_layer
from jaxinfer.models.deepseek_v32 import hf_leaves as dsa_hf_leaves
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.latent_attention import LATENT_NORM_EPS
from jaxinfer.models.layers import Weight, linear, linears
from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import CosSin, RopeTables
from jaxinfer.models.self_attention import HIDDEN, Q_HEADS
from jaxinfer.models.sparse_latent_attention import sparse_latent_heads
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("AXK2ForCausalLM",)
# AXK2Config's defaults for the fields a config may leave out (or null; n_group / topk_group null: no groups).
HF_DEFAULTS = dict(intermediate_size=5120, moe_intermediate_size=512, num_key_value_heads=32, n_shared_experts=1,
                   n_routed_experts=128, routed_scaling_factor=2.5, kv_lora_rank=128, q_lora_rank=384,
                   qk_rope_head_dim=32, v_head_dim=64, qk_nope_head_dim=64, num_experts_per_tok=8,
                   norm_topk_prob=True, max_position_embeddings=131072, rms_norm_eps=1e-6, bos_token_id=163691,
                   eos_token_id=163691, index_topk=2048, index_head_dim=128, index_n_heads=16, gated_norm_rank=16,
                   first_k_dense_replace=1, moe_layer_freq=1, tie_word_embeddings=False)
GROUPS = ("n_group", "topk_group")
LAYER = "model.layers.{i}."


@dataclasses.dataclass(kw_only=True)
class GatedFields:
    """What A.X-K2 adds to every layer: the query's output gate and the input norm's gate (D wide, rank r)."""

    attn_gate: Weight  # [2Q, H, V] q_b_proj's gate rows
    attn_norm_down: Weight  # [D, r] input_layernorm.W_down
    attn_norm_up: Weight  # [r, D] input_layernorm.W_up


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class GatedDenseLayer(DsaLayerWeights, GatedFields):
    """A dense layer: DeepSeek-V3.2's with the gated query and input norm."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class GatedMoELayer(DsaMoELayerWeights, GatedFields):
    """A sparse layer: DeepSeek-V3.2's with the gated query and both norms gated."""

    mlp_norm_down: Weight  # [D, r] post_attention_layernorm.W_down
    mlp_norm_up: Weight  # [r, D] post_attention_layernorm.W_up


def _norm_gate(cfg: ModelConfig) -> tuple[ArrayInfo, ArrayInfo]:
    """A gated norm's W_down and W_up as ArrayInfos (replicated: r is a few units)."""
    D, r = cfg.hidden_size, cfg.gated_norm_rank
    return ArrayInfo((D, r), ("embed", None)), ArrayInfo((r, D), (None, "embed"))


def abstract_layer(cfg: ModelConfig, layer: int) -> Any:
    """DeepSeek-V3.2's layer `layer` with the query over [normed, raw] q_a, its gate and the norms' gates."""
    base = dsa_layer(cfg, layer)
    mla = cfg.latent_attention
    H, Q, V = cfg.num_heads, mla.q_lora_rank, mla.v_head_dim
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    fields["wq"] = ArrayInfo((2 * Q, H, mla.qk_head_dim), (None, "q_heads", "head_dim"))
    down, up = _norm_gate(cfg)
    gated = dict(attn_gate=ArrayInfo((2 * Q, H, V), (None, "q_heads", "head_dim")), attn_norm_down=down,
                 attn_norm_up=up)
    if isinstance(base, DeepseekMoELayerWeights):
        return GatedMoELayer(**fields, **gated, mlp_norm_down=down, mlp_norm_up=up)
    return GatedDenseLayer(**fields, **gated)


def _gated_norm_leaves(cfg: ModelConfig, module: str, prefix: str) -> dict[str, HFLeaf]:
    """A gated norm's weight, W_down and W_up under LAYER + module, as leaves `{prefix}_norm`, `_down`, `_up`."""
    D, r = cfg.hidden_size, cfg.gated_norm_rank
    return {f"{prefix}_norm": HFLeaf(f"{LAYER}{module}.norm.weight", "same", (D,)),
            f"{prefix}_norm_down": HFLeaf(f"{LAYER}{module}.W_down.weight", "transpose", (r, D)),
            f"{prefix}_norm_up": HFLeaf(f"{LAYER}{module}.W_up.weight", "transpose", (D, r))}


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """DeepSeek-V3.2's names (the dense layers' plain `post_attention_layernorm`), `q_b_proj` read as each head's
    query rows then its gate's, the input norm's gate; the sparse layers' gated norm by `layer_hf_leaves`."""
    mla = cfg.latent_attention
    H, Q = cfg.num_heads, mla.q_lora_rank
    q_b = (LAYER + "self_attn.q_b_proj.weight", "in_head_rows", (H * (mla.qk_head_dim + mla.v_head_dim), 2 * Q), H)
    return {**dsa_hf_leaves(cfg), **_gated_norm_leaves(cfg, "input_layernorm", "attn"),
            "wq": HFLeaf(*q_b, mla.qk_head_dim),
            "attn_gate": HFLeaf(*q_b, mla.v_head_dim, row_offset=mla.qk_head_dim)}


def layer_hf_leaves(cfg: ModelConfig, layer: int) -> dict[str, HFLeaf]:
    """A sparse layer's post-attention norm, gated; nothing else differs by layer."""
    return _gated_norm_leaves(cfg, "post_attention_layernorm", "mlp") if cfg.is_moe_layer(layer) else {}


def gated_norm(x: jax.Array, weight: jax.Array, down: Weight, up: Weight, eps: float) -> jax.Array:
    """RMSNorm(x) = y times sigmoid(up(silu(down(y)))) in float32, in x's dtype."""
    y = rms_norm(x, weight, eps)
    gate = linear(jax.nn.silu(linear(y, down)), up)
    return (y.astype(jnp.float32) * jax.nn.sigmoid(gate.astype(jnp.float32))).astype(y.dtype)


def gated_query_attention(
    cfg: ModelConfig, h: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: CosSin,
) -> tuple[jax.Array, Any]:
    """`sparse_latent_attention` with the query and its gate from [normed, raw] q_a [B, T, 2Q], each head's output
    times sigmoid(gate): [B, T, D]."""
    q_raw, kv = linears(h, [lw.wq_a, lw.wkv_a])
    q_low = rms_norm(q_raw, lw.q_a_norm, LATENT_NORM_EPS)
    both = jnp.concatenate([q_low, q_raw], axis=-1)
    q, gate = linear(both, lw.wq), linear(both, lw.attn_gate)
    heads, written = sparse_latent_heads(cfg, h, cache, lw, layer, positions, rope, (q_low, q, kv))
    heads = (heads.astype(jnp.float32) * jax.nn.sigmoid(gate.astype(jnp.float32))).astype(heads.dtype)
    return linear(cache.layout.constrain(heads, Q_HEADS), lw.wo, contract=2), written


def decoder_layer(cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array,
                  rope: RopeTables) -> tuple[jax.Array, Any]:
    """One pre-norm block: the gated input norm, attention, then the gated norm and experts (or the plain norm and
    the dense MLP)."""
    layout, eps = cache.layout, cfg.rms_norm_eps
    h = gated_norm(x, lw.attn_norm, lw.attn_norm_down, lw.attn_norm_up, eps)
    out, cache = gated_query_attention(cfg, h, cache, lw, layer, positions, rope.for_layer(layer))
    x = layout.constrain(x + out, HIDDEN)
    if isinstance(lw, GatedMoELayer):
        mlp = moe_mlp(gated_norm(x, lw.mlp_norm, lw.mlp_norm_down, lw.mlp_norm_up, eps), lw, cfg, layout)
    else:
        mlp = gated_mlp(rms_norm(x, lw.mlp_norm, eps), lw.w_gate, lw.w_up, lw.w_down, cfg.activation)
    return layout.constrain(x + mlp, HIDDEN), cache


def expert_groups(hf: Mapping[str, Any], arch: str) -> tuple[int, int]:
    """(n_group, topk_group): both null routes over every expert (one group), as A.X-K2-Light does."""
    groups, per_token = (hf.get(name) for name in GROUPS)
    if (groups is None) != (per_token is None):
        raise ConfigError(f"n_group {groups!r} and topk_group {per_token!r} must be set together for {arch} (both "
                          "null: routing over all experts)")
    return (1, 1) if groups is None else (int(groups), int(per_token))


def check_layers(hf: Mapping[str, Any], arch: str, num_layers: int) -> None:
    """Refuse what A.X-K2 does not build or no release uses: a null or zero q_lora_rank, attention biases, layers other
    than indexed ones."""
    if hf.get("attention_bias"):
        raise ConfigError(f"attention_bias=True is not supported for {arch} (no released checkpoint uses it); "
                          "supported: False")
    if not hf["q_lora_rank"]:
        raise ConfigError(f"q_lora_rank {hf['q_lora_rank']!r} is not supported for {arch}: its query and output gate "
                          "read the low-rank query (q_lora_rank > 0)")
    types = field(hf, "layer_types")
    if types is not None and list(types) != ["indexed_attention"] * num_layers:
        raise ConfigError(f"layer_types {types!r} is not supported for {arch}: every layer is 'indexed_attention'")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an A.X-K2 HF config (AXK2Config's defaults where a key is absent or null)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None or key in KEPT_NULL + GROUPS}}
    num_layers = int(hf["num_hidden_layers"])
    check_layers(hf, arch, num_layers)
    dense = dense_layers(hf, arch, num_layers)
    groups, groups_per_token = expert_groups(hf, arch)
    kept = {k: v for k, v in hf.items() if k not in ("layer_types", "mlp_layer_types", "moe_layer_freq")}
    cfg = v3_config({**kept, "n_group": groups, "topk_group": groups_per_token, "rope_interleave": True,
                     "num_nextn_predict_layers": int(field(hf, "num_nextn_predict_layers", 0))}, V3)
    indexer = LightningIndexer(index_topk=int(hf["index_topk"]), index_head_dim=int(hf["index_head_dim"]),
                               index_n_heads=int(hf["index_n_heads"]), rope_interleaved=False)
    if indexer.index_head_dim < cfg.rotary_dim or indexer.index_topk < 1:
        raise ConfigError(f"index_head_dim {indexer.index_head_dim} / index_topk {indexer.index_topk} not supported "
                          f"for {arch}: index_head_dim >= qk_rope_head_dim ({cfg.rotary_dim}), index_topk >= 1")
    rank = int(hf["gated_norm_rank"])
    if rank < 1:
        raise ConfigError(f"gated_norm_rank {rank} must be >= 1 for {arch} (its norms' gate MLP width)")
    mla = dataclasses.replace(cfg.latent_attention, indexer=indexer)
    return dataclasses.replace(cfg, architecture=arch, latent_attention=mla, head_dim=mla.cached_dims,
                               dense_layers=dense, gated_norm_rank=rank)


FAMILY = Family("axk2", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                layer_hf_leaves=layer_hf_leaves)
