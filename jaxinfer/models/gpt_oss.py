"""GPT-OSS (gpt-oss-20b, gpt-oss-120b): attention with per-head sinks, then biased routed experts.

Beside the pre-norm MoE layer of `models.moe`: q/k/v/o projections with biases; a learned sink
logit per head in every softmax (a key without a value, see `blocked_attention.softmax_with_sinks`);
sliding-window layers alternating with global ones (`layer_types`); YaRN rotary scaling. The
router has a bias and takes the top k of its logits, then a softmax over those k. Experts keep
their gate and up units interleaved in one tensor with biases, gate with `ClampedSwiGLU`, and add
a down bias mixed by the routing weights.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, ModelConfig, common_fields, field, layer_types
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.mlp import ClampedSwiGLU
from jaxinfer.models.moe import DOWN_AXES, GATE_AXES, ROUTER_AXES, MoELayerWeights, experts_output, pre_norm_layer
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import attention_hf_leaves, attention_leaves
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("GptOssForCausalLM",)
BIAS_AXES = ("experts", "mlp")  # gate_bias, up_bias [E, F]: split like the experts' hidden units


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class GptOssLayerWeights:
    """One GPT-OSS layer: attention with biases and sinks, then biased routed experts."""

    attn_norm: jax.Array  # [D]
    wq: Weight  # [D, H, K]
    wk: Weight  # [D, KV, K]
    wv: Weight  # [D, KV, K]
    wo: Weight  # [H, K, D]
    bq: jax.Array  # [H, K]
    bk: jax.Array  # [KV, K]
    bv: jax.Array  # [KV, K]
    bo: jax.Array  # [D]
    sinks: jax.Array  # [H]
    mlp_norm: jax.Array  # [D]
    router: jax.Array  # [D, E]
    router_bias: jax.Array  # [E]
    moe_gate: jax.Array  # [E, D, F]
    moe_up: jax.Array  # [E, D, F]
    moe_down: jax.Array  # [E, F, D]
    gate_bias: jax.Array  # [E, F]
    up_bias: jax.Array  # [E, F]
    down_bias: jax.Array  # [E, D]
    q_norm: jax.Array | None = None  # never set: self_attention reads the field
    k_norm: jax.Array | None = None

    PROJECTIONS: ClassVar[dict[str, int]] = MoELayerWeights.PROJECTIONS
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = MoELayerWeights.JOINED
    EXPERTS: ClassVar[tuple[str, ...]] = MoELayerWeights.EXPERTS


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> GptOssLayerWeights:
    """One layer's leaves as ArrayInfos."""
    D, E, F = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    return GptOssLayerWeights(
        attn_norm=ArrayInfo((D,), ("embed",), init_value=1.0),
        mlp_norm=ArrayInfo((D,), ("embed",), init_value=1.0),
        router=ArrayInfo((D, E), ROUTER_AXES),
        router_bias=ArrayInfo((E,), (None,)),
        moe_gate=ArrayInfo((E, D, F), GATE_AXES),
        moe_up=ArrayInfo((E, D, F), GATE_AXES),
        moe_down=ArrayInfo((E, F, D), DOWN_AXES),
        gate_bias=ArrayInfo((E, F), BIAS_AXES),
        up_bias=ArrayInfo((E, F), BIAS_AXES),
        down_bias=ArrayInfo((E, D), ("experts", "embed")),
        **attention_leaves(cfg),
    )


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives: the experts as three fused tensors [E, in, out] (gate and up interleaved)."""
    D, E, F, mlp = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, "model.layers.{i}.mlp."
    return {
        "attn_norm": HFLeaf("model.layers.{i}.input_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf("model.layers.{i}.post_attention_layernorm.weight", "same", (D,)),
        "router": HFLeaf(mlp + "router.weight", "transpose", (E, D)),
        "router_bias": HFLeaf(mlp + "router.bias", "same", (E,)),
        "moe_gate": HFLeaf(mlp + "experts.gate_up_proj", "even_columns", (E, D, 2 * F)),
        "moe_up": HFLeaf(mlp + "experts.gate_up_proj", "odd_columns", (E, D, 2 * F)),
        "moe_down": HFLeaf(mlp + "experts.down_proj", "same", (E, F, D)),
        "gate_bias": HFLeaf(mlp + "experts.gate_up_proj_bias", "even_columns", (E, 2 * F)),
        "up_bias": HFLeaf(mlp + "experts.gate_up_proj_bias", "odd_columns", (E, 2 * F)),
        "down_bias": HFLeaf(mlp + "experts.down_proj_bias", "same", (E, D)),
        **attention_hf_leaves(cfg),
    }


def route_top_logits(x: jax.Array, router: jax.Array, bias: jax.Array | None, k: int) -> tuple[jax.Array, jax.Array]:
    """Routing weights [N, k] (float32) and expert ids [N, k]: the top k (biased) logits, softmaxed among
    themselves (Granite-MoE's router has no bias)."""
    logits = linear(x, router).astype(jnp.float32)
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    top, experts = jax.lax.top_k(logits, k)
    return jax.nn.softmax(top, axis=-1), experts


def experts_block(x: jax.Array, lw: GptOssLayerWeights, cfg: ModelConfig, layout: Layout) -> jax.Array:
    """The biased routed experts' output for x [B, T, D] in x's dtype."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    weights, experts = route_top_logits(x2, lw.router, lw.router_bias, cfg.experts_per_token)
    gate = ClampedSwiGLU(cfg.swiglu_alpha, cfg.swiglu_limit)
    out = experts_output(x2, weights, experts, lw, layout, gate, biases=(lw.gate_bias, lw.up_bias))
    # The down bias of each chosen expert, mixed like its output (outside the experts' shards,
    # whose partial sums would add it once per hidden-unit shard).
    down_bias = jnp.einsum("nk,nkd->nd", weights, lw.down_bias[experts].astype(jnp.float32))
    return (out + down_bias).astype(x.dtype).reshape(shape)


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: GptOssLayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """One pre-norm block: attention (with sinks) over the cache, then the experts."""
    return pre_norm_layer(cfg, x, cache, lw, layer, positions, rope,
                          lambda h, layout: experts_block(h, lw, cfg, layout))


def _windows(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """`sliding_window` on the layers `layer_types` marks sliding (transformers' default: every other one)."""
    window = int(field(hf, "sliding_window", 0))
    types = layer_types(hf, num_layers) or ["sliding_attention" if i % 2 == 0 else "full_attention"
                                            for i in range(num_layers)]
    return tuple(window if t == "sliding_attention" else 0 for t in types)


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a GPT-OSS HF config."""
    fields = common_fields(hf, arch)
    experts = int(field(hf, "num_local_experts", 0))
    if experts < 1:
        raise ConfigError(f"num_local_experts {experts} must be >= 1 for {arch}")
    bias = bool(hf.get("attention_bias", True))
    if not bias:
        raise ConfigError(f"attention_bias=False is not supported for {arch} (every released checkpoint has biases)")
    return ModelConfig(
        **fields,
        qkv_bias=True,
        o_bias=True,
        attn_sinks=True,
        layer_windows=_windows(hf, fields["num_layers"]),
        num_experts=experts,
        experts_per_token=int(field(hf, "num_experts_per_tok", field(hf, "experts_per_token", 4))),
        moe_intermediate_size=fields["intermediate_size"],
        swiglu_alpha=float(field(hf, "swiglu_alpha", 1.702)),
        swiglu_limit=float(field(hf, "swiglu_limit", 7.0)),
    )


FAMILY = Family("gpt_oss", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
