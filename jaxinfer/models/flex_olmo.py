"""FlexOlmo (FlexOlmoForCausalLM: AI2's FlexOlmo-7x7B-1T): OLMo 2's post-norm layer over OLMoE's routed experts.

Each sublayer's output is normed before the residual add and its input not at all, and the q/k
RMSNorms span all heads' dims at once (`cfg.qk_norm_whole`), as in OLMo 2 (`olmo2`); the MLP routes
each token to `num_experts_per_tok` of `num_experts` experts of `intermediate_size` hidden units
by softmax, renormalising the chosen weights only with `norm_topk_prob`, as OLMoE's (`models.moe`),
whose tensor names it keeps (`mlp.gate`, `mlp.experts.{e}.*_proj`). Fields a config leaves out take
FlexOlmoConfig's defaults (7 experts, 5 per token, theta 500000).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.grouped_matmul import Experts
from jaxinfer.models.layers import Weight
from jaxinfer.models.moe import MoELayerWeights, abstract_moe_layer, experts_hf_leaves, moe_block
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.olmoe import moe_config
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, attention_hf_leaves, self_attention

ARCHITECTURES = ("FlexOlmoForCausalLM",)
# FlexOlmoConfig's defaults for fields a config leaves out (where common_fields' differ).
DEFAULTS = dict(rope_theta=500000.0, eos_token_id=100257)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PostNormMoELayerWeights:
    """One FlexOlmo layer: attention and the routed experts, each followed by a norm of its output."""

    wq: Weight  # [D, H, K]
    wk: Weight  # [D, KV, K]
    wv: Weight  # [D, KV, K]
    wo: Weight  # [H, K, D]
    q_norm: jax.Array  # [H, K]: one RMSNorm over all of q's heads
    k_norm: jax.Array  # [KV, K]
    post_attn_norm: jax.Array  # [D]
    router: jax.Array  # [D, E]
    moe_gate: Experts  # [E, D, F]
    moe_up: Experts  # [E, D, F]
    moe_down: Experts  # [E, F, D]
    post_mlp_norm: jax.Array  # [D]
    bq: jax.Array | None = None  # [H, K]
    bk: jax.Array | None = None  # [KV, K]
    bv: jax.Array | None = None  # [KV, K]
    bo: jax.Array | None = None  # [D]

    PROJECTIONS: ClassVar[dict[str, int]] = MoELayerWeights.PROJECTIONS
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = MoELayerWeights.JOINED
    EXPERTS: ClassVar[tuple[str, ...]] = MoELayerWeights.EXPERTS


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> PostNormMoELayerWeights:
    """One layer's leaves as ArrayInfos: OLMoE's, its two norms moved after the sublayers."""
    base = abstract_moe_layer(cfg)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(PostNormMoELayerWeights)
              if f.name not in ("post_attn_norm", "post_mlp_norm")}
    return PostNormMoELayerWeights(post_attn_norm=base.attn_norm, post_mlp_norm=base.mlp_norm, **fields)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives: OLMo 2's norm names, OLMoE's router and experts."""
    D, E, layer = cfg.hidden_size, cfg.num_experts, "model.layers.{i}."
    return {
        "post_attn_norm": HFLeaf(layer + "post_attention_layernorm.weight", "same", (D,)),
        "post_mlp_norm": HFLeaf(layer + "post_feedforward_layernorm.weight", "same", (D,)),
        "router": HFLeaf(layer + "mlp.gate.weight", "transpose", (E, D)),
        **attention_hf_leaves(cfg),
        **experts_hf_leaves(cfg, layer + "mlp.experts.", ("gate_proj", "up_proj", "down_proj")),
    }


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: PostNormMoELayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """attention -> norm -> residual add, then routed experts -> norm -> residual add."""
    layout, eps = cache.layout, cfg.rms_norm_eps
    out, cache = self_attention(cfg, x, cache, lw, layer, positions, rope.for_layer(layer))
    x = layout.constrain(x + rms_norm(out, lw.post_attn_norm, eps), HIDDEN)
    h = moe_block(x, lw, cfg, layout)
    return layout.constrain(x + rms_norm(h, lw.post_mlp_norm, eps), HIDDEN), cache


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a FlexOlmo HF config: OLMoE's, with FlexOlmo's defaults."""
    return moe_config({**DEFAULTS, **hf}, arch, experts=7, per_token=5)


FAMILY = Family("flex_olmo", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
