"""MiniMax-M3 (`MiniMaxM3VLForCausalLM`, and `MiniMaxM3SparseForConditionalGeneration` text-only; transformers'
models/minimax_m3_vl): MiniMax-M2's pre-norm MoE layer with Gemma's norms, GPT-OSS's gate and a block indexer.

- Every RMSNorm (the layer's, the final one, the per-head q/k norms, the indexer's) scales by 1 + w (Gemma 3's).
- Attention: q/k normed per head, then the leading head_dim x partial_rotary_factor dims rotated (rotate-half;
  transformers reads the factor from rope_parameters and ignores `rotary_dim`, so a config where they disagree
  is refused by name). On the `minimax_m3_sparse` layers each K/V head attends only its index head's chosen key
  blocks (models/minimax_m3_attention); `full_attention` layers attend every earlier key.
- MLP (`mlp_layer_types`): "dense" layers a gated MLP of dense_intermediate_size; "sparse" ones route
  num_experts_per_tok of num_local_experts experts (intermediate_size wide) by sigmoid score + correction bias,
  renormalised, x routed_scaling_factor, beside an ungated shared expert of shared_intermediate_size. Every gate is
  GPT-OSS's clamped SwiGLU with (up + 1) (`mlp.ClampedSwiGLU`), gate and up the halves of one fused projection.
- The conditional-generation checkpoint (LLaVA's layout: `model.language_model.*`, `lm_head.*`, the tower and
  projector beside) runs its language model alone (models/text_part): images refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.minimax_m3 import BlockIndexer
from jaxinfer.config.model import ConfigError, ModelConfig, common_fields, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.glm import mlp_hf_leaves, rotary_dim
from jaxinfer.models.glm4_moe import Glm4MoeLayerWeights
from jaxinfer.models.glm4_moe import abstract_layer as glm4_moe_layer
from jaxinfer.models.grouped_topk import grouped_topk
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.minimax_m3_attention import block_sparse_attention
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.mlp import ClampedSwiGLU, gated_mlp
from jaxinfer.models.mlp import mlp_hf_leaves as mlp_leaves_unfused
from jaxinfer.models.moe import experts_hf_leaves, experts_output
from jaxinfer.models.norms import config_norm
from jaxinfer.models.qwen3_5 import fused_experts_hf_leaves
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, attention_hf_leaves, self_attention
from jaxinfer.models.shared_expert import shared_expert_hf_leaves
from jaxinfer.models.token_rows import half_width
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("MiniMaxM3VLForCausalLM", "MiniMaxM3SparseForConditionalGeneration")
LAYER = "model.layers.{i}."
SPARSE = "minimax_m3_sparse"
# MiniMaxM3VLTextConfig's defaults for fields a config leaves out (or nulls) where common_fields' differ.
DEFAULTS = dict(vocab_size=200064, num_key_value_heads=4, head_dim=128, rope_theta=5e6, rms_norm_eps=1e-6,
                max_position_embeddings=524288, bos_token_id=200034, eos_token_id=200020, intermediate_size=3072,
                dense_intermediate_size=12288, shared_intermediate_size=3072, num_local_experts=128,
                num_experts_per_tok=4, routed_scaling_factor=2.0, swiglu_alpha=1.702, swiglu_limit=7.0,
                index_n_heads=4, index_head_dim=128, index_block_size=128, index_topk_blocks=16, index_local_blocks=1)
# transformers' legacy `sparse_attention_config` keys -> the flat ones it reads them as
LEGACY_INDEXER = dict(sparse_num_index_heads="index_n_heads", sparse_index_dim="index_head_dim",
                      sparse_block_size="index_block_size", sparse_topk_blocks="index_topk_blocks",
                      sparse_local_block="index_local_blocks")


@dataclasses.dataclass
class IndexerLeaves:
    """A sparse layer's indexer (None on full-attention layers; J: index heads, I: index_head_dim)."""

    index_wq: Weight | None = None  # [D, J * I]
    index_wk: Weight | None = None  # [D, I]
    index_q_norm: jax.Array | None = None  # [I] (1 + w)
    index_k_norm: jax.Array | None = None  # [I] (1 + w)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DenseLayer(IndexerLeaves, LayerWeights):
    """A "dense" MLP layer: Llama's leaves (the gated MLP dense_intermediate_size wide) and any indexer's."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MoELayer(IndexerLeaves, Glm4MoeLayerWeights):
    """A "sparse" MLP layer: the routed experts, the ungated shared expert, the correction bias, any indexer's."""


def abstract_layer(cfg: ModelConfig, layer: int) -> DenseLayer | MoELayer:
    """Layer `layer`'s leaves: GLM-4.5's dense or MoE layer, with the indexer's on a sparse-attention layer."""
    base = glm4_moe_layer(cfg, layer)
    leaves = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    idx, D = cfg.block_indexer, cfg.hidden_size
    if layer in idx.layers:
        leaves |= dict(index_wq=ArrayInfo((D, idx.heads * idx.dim), ("embed", None)),
                       index_wk=ArrayInfo((D, idx.dim), ("embed", None)),
                       index_q_norm=ArrayInfo((idx.dim,), (None,), init_value=0.0),
                       index_k_norm=ArrayInfo((idx.dim,), (None,), init_value=0.0))
    return (MoELayer if cfg.is_moe_layer(layer) else DenseLayer)(**leaves)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """The tensors as each class saves them: MiniMaxM3VLForCausalLM transformers' own names (fused dense and shared
    gate_up_proj, fused experts, the router's `mlp.gate` with its bias, `self_attn.indexer.*`); the conditional
    generation checkpoint MiniMax's layout, which its save writes back (`block_sparse_moe.*`, each expert's
    w1 / w3 / w2, unfused gate_proj / up_proj, `self_attn.index_*`)."""
    if cfg.architecture == ARCHITECTURES[1]:
        return hub_hf_leaves(cfg)
    D, E, S, mlp = cfg.hidden_size, cfg.num_experts, cfg.shared_expert_intermediate_size, LAYER + "mlp."
    shared = (mlp + "shared_experts.gate_up_proj.weight", "transpose", (2 * S, D))
    return {
        **common_hf_leaves(cfg), **mlp_hf_leaves(cfg), **indexer_hf_leaves(cfg, LAYER + "self_attn.indexer."),
        "router": HFLeaf(mlp + "gate.weight", "transpose", (E, D)),
        "score_correction": HFLeaf(mlp + "gate.e_score_correction_bias", "same", (E,)),
        **fused_experts_hf_leaves(cfg, mlp + "experts."),
        "shared_gate": HFLeaf(*shared),
        "shared_up": HFLeaf(*shared, row_offset=S),
        "shared_down": HFLeaf(mlp + "shared_experts.down_proj.weight", "transpose", (D, S)),
    }


def hub_hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """MiniMax's names (transformers' conversion mapping written back on save)."""
    D, E, moe = cfg.hidden_size, cfg.num_experts, LAYER + "block_sparse_moe."
    return {
        **common_hf_leaves(cfg), **mlp_leaves_unfused(D, cfg.intermediate_size),
        **indexer_hf_leaves(cfg, LAYER + "self_attn.index_"),
        "router": HFLeaf(moe + "gate.weight", "transpose", (E, D)),
        "score_correction": HFLeaf(moe + "e_score_correction_bias", "same", (E,)),
        **experts_hf_leaves(cfg, moe + "experts.", ("w1", "w3", "w2")),
        **shared_expert_hf_leaves(cfg, moe, "shared_experts.", gated=False),
    }


def common_hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """The norms and the attention, named alike in both layouts."""
    D = cfg.hidden_size
    return {
        "attn_norm": HFLeaf(LAYER + "input_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf(LAYER + "post_attention_layernorm.weight", "same", (D,)),
        **attention_hf_leaves(cfg),
    }


def indexer_hf_leaves(cfg: ModelConfig, prefix: str) -> dict[str, HFLeaf]:
    """The indexer's projections and norms: "{prefix}q_proj" and so on (`indexer.q_proj`, `index_q_proj`)."""
    idx, D = cfg.block_indexer, cfg.hidden_size
    name = lambda part: f"{prefix}{part}.weight"  # noqa: E731
    return {
        "index_wq": HFLeaf(name("q_proj"), "transpose", (idx.heads * idx.dim, D)),
        "index_wk": HFLeaf(name("k_proj"), "transpose", (idx.dim, D)),
        "index_q_norm": HFLeaf(name("q_norm"), "same", (idx.dim,)),
        "index_k_norm": HFLeaf(name("k_norm"), "same", (idx.dim,)),
    }


def moe_block(h: jax.Array, lw: MoELayer, cfg: ModelConfig, gate: ClampedSwiGLU, layout: Any) -> jax.Array:
    """The routed experts (sigmoid routing with the correction bias, renormalised, scaled) plus the shared one."""
    h2 = h.reshape(-1, h.shape[-1])
    logits = linear(h2.astype(jnp.float32), lw.router)
    weights, experts = grouped_topk(logits, lw.score_correction, cfg.experts_per_token, 1, 1, True,
                                    cfg.routed_scaling_factor)
    routed = experts_output(h2, weights, experts, lw, layout, gate).astype(h.dtype).reshape(h.shape)
    return routed + gated_mlp(h, lw.shared_gate, lw.shared_up, lw.shared_down, gate)


def decoder_layer(cfg: ModelConfig, x: jax.Array, cache: Any, lw: DenseLayer | MoELayer, layer: int,
                  positions: jax.Array, rope: RopeTables) -> tuple[jax.Array, Any]:
    """Pre-norm attention (block-sparse where the layer has an indexer), then the dense MLP or the experts."""
    layout, gate = cache.layout, ClampedSwiGLU(cfg.swiglu_alpha, cfg.swiglu_limit)
    h = config_norm(x, lw.attn_norm, None, cfg)
    attend = block_sparse_attention if lw.index_wq is not None else self_attention
    out, cache = attend(cfg, h, cache, lw, layer, positions, rope.for_layer(layer))
    x = layout.constrain(x + out, HIDDEN)
    h = config_norm(x, lw.mlp_norm, None, cfg)
    mlp = gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, gate) if isinstance(lw, DenseLayer) else \
        moe_block(h, lw, cfg, gate, layout)
    return layout.constrain(x + mlp, HIDDEN), cache


def flat_config(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The config as transformers reads it: DEFAULTS filled in, a legacy `sparse_attention_config` and
    `moe_layer_freq` read as the flat index_* fields, layer_types and mlp_layer_types."""
    legacy = hf.get("sparse_attention_config") or {}
    flat = {**DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    flat |= {LEGACY_INDEXER[key]: value for key, value in legacy.items() if key in LEGACY_INDEXER}
    if hf.get("layer_types") is None and "sparse_attention_freq" in legacy:
        flat["layer_types"] = [SPARSE if f else "full_attention" for f in legacy["sparse_attention_freq"]]
    if hf.get("mlp_layer_types") is None and hf.get("moe_layer_freq") is not None:
        flat["mlp_layer_types"] = ["sparse" if f else "dense" for f in hf["moe_layer_freq"]]
    return flat


def layer_kinds(hf: Mapping[str, Any], key: str, kinds: tuple[str, str], default: str, layers: int) -> list[str]:
    """A per-layer list (`layer_types`, `mlp_layer_types`), each entry one of `kinds`; all `default` where unset."""
    values = list(field(hf, key, None) or [default] * layers)
    if len(values) != layers or any(v not in kinds for v in values):
        raise ConfigError(f"{key} {values!r} is not supported: one of {kinds} per layer ({layers} layers)")
    return values


def block_indexer(hf: Mapping[str, Any], sparse: tuple[int, ...], kv_heads: int, rotated: int) -> BlockIndexer:
    """The indexer's settings, checked against what transformers' block mask and rope assume."""
    idx = BlockIndexer(heads=int(hf["index_n_heads"]), dim=int(hf["index_head_dim"]), block=int(hf["index_block_size"]),
                       top_blocks=int(hf["index_topk_blocks"]), local_blocks=int(hf["index_local_blocks"]),
                       layers=sparse)
    if idx.heads != kv_heads:
        raise ConfigError(f"index_n_heads {idx.heads} is not supported: it must equal num_key_value_heads "
                          f"{kv_heads} (one block choice per K/V head)")
    if idx.block < 1 or idx.top_blocks < 1 or not 0 <= idx.local_blocks <= idx.top_blocks:
        raise ConfigError(f"index_block_size {idx.block} / index_topk_blocks {idx.top_blocks} / index_local_blocks "
                          f"{idx.local_blocks} are not supported: block and top-k >= 1, 0 <= local <= top-k")
    if idx.dim < rotated:
        raise ConfigError(f"index_head_dim {idx.dim} is not supported: at least the {rotated} rotated dims")
    return idx


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a MiniMax-M3 text config (its defaults where fields are left out)."""
    hf = flat_config(hf)
    fields = common_fields({**hf, "intermediate_size": hf["dense_intermediate_size"]}, arch)
    layers, head_dim, kv = fields["num_layers"], fields["head_dim"], fields["num_kv_heads"]
    rotated = rotary_dim({**hf, "partial_rotary_factor": field(hf, "partial_rotary_factor", 1.0)}, head_dim)
    if "rotary_dim" in hf and int(hf["rotary_dim"]) != rotated:
        raise ConfigError(f"rotary_dim {hf['rotary_dim']} is not supported where transformers turns {rotated} of the "
                          f"{head_dim} head dims (rope_parameters' partial_rotary_factor; it ignores rotary_dim): "
                          f"set partial_rotary_factor {int(hf['rotary_dim']) / head_dim}")
    types = layer_kinds(hf, "layer_types", (SPARSE, "full_attention"), "full_attention", layers)
    mlps = layer_kinds(hf, "mlp_layer_types", ("sparse", "dense"), "sparse", layers)
    sparse = tuple(i for i, kind in enumerate(types) if kind == SPARSE)
    idx = block_indexer(hf, sparse, kv, rotated)
    if int(hf["shared_intermediate_size"]) < 1:
        raise ConfigError(f"shared_intermediate_size {hf['shared_intermediate_size']} must be >= 1 (transformers "
                          "always runs the shared expert)")
    row = half_width(2 * kv * head_dim + idx.dim)
    return ModelConfig(
        **fields,
        layer_kv_heads=tuple(1 if i in sparse else kv for i in range(layers)),
        layer_head_dims=tuple(row if i in sparse else head_dim for i in range(layers)),
        rotary_dim=rotated,
        qk_norm=True,
        norm_weight_offset=1.0,
        activation="silu",
        layer_windows=(0,) * layers,
        dense_layers=tuple(i for i, kind in enumerate(mlps) if kind == "dense"),
        norm_topk_prob=True,
        routed_scaling_factor=float(hf["routed_scaling_factor"]),
        shared_expert_intermediate_size=int(hf["shared_intermediate_size"]),
        swiglu_alpha=float(hf["swiglu_alpha"]),
        swiglu_limit=float(hf["swiglu_limit"]),
        block_indexer=idx,
        **moe_fields(hf, "num_local_experts", int(hf["intermediate_size"]), experts=128, per_token=4),
    )


FAMILY = Family("minimax_m3", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
