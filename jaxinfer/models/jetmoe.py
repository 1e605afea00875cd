"""JetMoE (JetMoeForCausalLM: jetmoe/jetmoe-8b): a mixture of attention heads and a mixture of MLP experts.

Attention: a router over `num_local_experts` attention experts picks `num_experts_per_tok` (k) per
token by its top k logits, softmaxed among themselves. Each expert is a query projection to
`num_key_value_heads` (KV) heads of `kv_channels` (K) dims and an output projection back; the keys and
values are shared (`kv_proj`: k's rows, then v's). A token's queries are its k experts' (H = k * KV
heads, slot s's head h reading key head h), rotated and attended as any GQA layer's; each slot's
output goes through its expert's output projection, weighted by the gate, summed, plus one bias.
Here every expert's query and output projection is computed and the chosen ones picked (E / k times
the attention projections' arithmetic: 4x for JetMoE-8B's 8 experts, 2 per token), so the attention
itself stays the shared paged one. The queries are ordered head-major ([KV, k]: head h's k slots
side by side) so that jaxinfer's grouping (query head j reads key head j // k) is transformers'.

MLP: Granite-MoE's experts (`input_linear` [E, 2F, D]: gate rows then up rows; top-k logits softmaxed),
plus one bias. The layers' RMSNorms use transformers' default epsilon (1e-6) whatever `rms_norm_eps`
says (JetMoeRMSNorm is built without it); the final norm uses `rms_norm_eps`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, uniform_windows
from jaxinfer.models.attention import attend
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.gpt_oss import route_top_logits
from jaxinfer.models.grouped_matmul import Experts
from jaxinfer.models.layers import Weight, linears
from jaxinfer.models.moe import DOWN_AXES, GATE_AXES, ROUTER_AXES, experts_output
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables, apply_rope
from jaxinfer.models.self_attention import HIDDEN, KV_HEADS, Q_HEADS
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("JetMoeForCausalLM",)
LAYER_NORM_EPS = 1e-6  # JetMoeRMSNorm's default: the layers' norms are built without rms_norm_eps
# JetMoeConfig's defaults for fields a config leaves out.
DEFAULTS = dict(num_key_value_heads=16, kv_channels=128, num_local_experts=8, num_experts_per_tok=2,
                activation_function="silu", tie_word_embeddings=True, max_position_embeddings=4096)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class JetMoeLayerWeights:
    """One layer: routed attention experts over shared keys and values, then routed MLP experts."""

    attn_norm: jax.Array  # [D]
    attn_router: jax.Array  # [D, E]
    q_experts: jax.Array  # [E, D, KV * K]: each attention expert's query projection
    o_experts: jax.Array  # [E, KV * K, D]: its output projection
    attn_bias: jax.Array  # [D]
    wk: Weight  # [D, KV, K]
    wv: Weight  # [D, KV, K]
    mlp_norm: jax.Array  # [D]
    router: jax.Array  # [D, E]
    moe_gate: Experts  # [E, D, F]
    moe_up: Experts  # [E, D, F]
    moe_down: Experts  # [E, F, D]
    mlp_bias: jax.Array  # [D]

    PROJECTIONS: ClassVar[dict[str, int]] = {"wk": 1, "wv": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("wk", "wv"),)
    EXPERTS: ClassVar[tuple[str, ...]] = ("moe_gate", "moe_up", "moe_down")


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> JetMoeLayerWeights:
    """One layer's leaves as ArrayInfos (the attention experts replicated: they are small beside the MLP's)."""
    D, E, F, KV, K = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, cfg.num_kv_heads, cfg.head_dim
    vec = ArrayInfo((D,), ("embed",))
    norm = ArrayInfo((D,), ("embed",), init_value=1.0)
    return JetMoeLayerWeights(
        attn_norm=norm, attn_router=ArrayInfo((D, E), ROUTER_AXES),
        q_experts=ArrayInfo((E, D, KV * K), (None, "embed", None)),
        o_experts=ArrayInfo((E, KV * K, D), (None, None, "embed")), attn_bias=vec,
        wk=ArrayInfo((D, KV, K), ("embed", "kv_heads", "head_dim")),
        wv=ArrayInfo((D, KV, K), ("embed", "kv_heads", "head_dim")),
        mlp_norm=norm, router=ArrayInfo((D, E), ROUTER_AXES), moe_gate=ArrayInfo((E, D, F), GATE_AXES),
        moe_up=ArrayInfo((E, D, F), GATE_AXES), moe_down=ArrayInfo((E, F, D), DOWN_AXES), mlp_bias=vec,
    )


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives: k and v as row ranges of `kv_proj`, the experts stored [E, out, in]."""
    D, E, F, KV, K = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, cfg.num_kv_heads, cfg.head_dim
    layer = "model.layers.{i}."
    attn, mlp = layer + "self_attention.", layer + "mlp."
    kv = (attn + "kv_proj.weight", "in_heads", (2 * KV * K, D), KV, K)
    experts = (mlp + "input_linear.weight", "transpose", (E, 2 * F, D))
    return {
        "attn_norm": HFLeaf(layer + "input_layernorm.weight", "same", (D,)),
        "attn_router": HFLeaf(attn + "experts.router.layer.weight", "transpose", (E, D)),
        "q_experts": HFLeaf(attn + "experts.input_linear.weight", "transpose", (E, KV * K, D)),
        "o_experts": HFLeaf(attn + "experts.output_linear.weight", "transpose", (E, D, KV * K)),
        "attn_bias": HFLeaf(attn + "experts.bias", "same", (D,)),
        "wk": HFLeaf(*kv), "wv": HFLeaf(*kv, row_offset=KV * K),
        "mlp_norm": HFLeaf(layer + "post_attention_layernorm.weight", "same", (D,)),
        "router": HFLeaf(mlp + "router.layer.weight", "transpose", (E, D)),
        "moe_gate": HFLeaf(*experts), "moe_up": HFLeaf(*experts, row_offset=F),
        "moe_down": HFLeaf(mlp + "output_linear.weight", "transpose", (E, D, F)),
        "mlp_bias": HFLeaf(mlp + "bias", "same", (D,)),
    }


def routed_attention(cfg: ModelConfig, h: jax.Array, cache: Any, lw: JetMoeLayerWeights, layer: int,
                     positions: jax.Array, rope: RopeTables) -> tuple[jax.Array, Any]:
    """The mixture of attention heads over the normed input h [B, T, D]: [B, T, D] and the cache."""
    B, T, D = h.shape
    KV, K, k = cfg.num_kv_heads, cfg.head_dim, cfg.experts_per_token
    layout = cache.layout
    gates, chosen = route_top_logits(h.reshape(-1, D), lw.attn_router, None, k)  # [N, k]
    every_q = jnp.einsum("btd,edc->btec", h, lw.q_experts.astype(h.dtype))  # [B, T, E, KV * K]
    q = jnp.take_along_axis(every_q, chosen.reshape(B, T, k, 1), axis=2).reshape(B, T, k, KV, K)
    q = layout.constrain(q.transpose(0, 1, 3, 2, 4).reshape(B, T, KV * k, K), Q_HEADS)  # head-major: [KV, k]
    key, value = (layout.constrain(t, KV_HEADS) for t in linears(h, [lw.wk, lw.wv]))
    cos, sin = rope.for_layer(layer)
    q, key = apply_rope(q, cos, sin), apply_rope(key, cos, sin)
    cache = cache.write(layer, key, value, positions)
    out = attend(q, cache, layer, positions, cfg.layer_windows[layer])  # [B, T, KV * k, K]
    slots = out.reshape(B, T, KV, k, K).transpose(0, 1, 3, 2, 4).reshape(B, T, k, KV * K)
    # Each slot's output through its expert, weighted by its gate: the slots mixed per expert, then every
    # expert's output projection taken once (an unchosen expert's mix is zero).
    weights = (gates[:, :, None] * jax.nn.one_hot(chosen, cfg.num_experts)).reshape(B, T, k, cfg.num_experts)
    mixed = jnp.einsum("btke,btkc->btec", weights, slots.astype(jnp.float32))
    attn = jnp.einsum("btec,ecd->btd", mixed, lw.o_experts.astype(jnp.float32))
    return (attn + lw.attn_bias.astype(jnp.float32)).astype(h.dtype), cache


def experts_block(cfg: ModelConfig, h: jax.Array, lw: JetMoeLayerWeights, layout: Layout) -> jax.Array:
    """The routed MLP experts' output for h [B, T, D] (top-k logits softmaxed) plus the MLP's bias."""
    h2 = h.reshape(-1, h.shape[-1])
    weights, experts = route_top_logits(h2, lw.router, None, cfg.experts_per_token)
    out = experts_output(h2, weights, experts, lw, layout, cfg.activation) + lw.mlp_bias.astype(jnp.float32)
    return out.astype(h.dtype).reshape(h.shape)


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: JetMoeLayerWeights, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """Pre-norm routed attention, then the pre-norm routed MLP, each added to the residual stream."""
    layout = cache.layout
    out, cache = routed_attention(cfg, rms_norm(x, lw.attn_norm, LAYER_NORM_EPS), cache, lw, layer, positions, rope)
    x = layout.constrain(x + out, HIDDEN)
    h = experts_block(cfg, rms_norm(x, lw.mlp_norm, LAYER_NORM_EPS), lw, layout)
    return layout.constrain(x + h, HIDDEN), cache


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a JetMoE HF config: KV * k query heads of kv_channels dims (num_attention_heads is derived,
    as transformers derives it), each expert intermediate_size wide."""
    hf = {**DEFAULTS, **hf}
    k, experts = int(hf["num_experts_per_tok"]), int(hf["num_local_experts"])
    if not 1 <= k <= experts:
        raise ConfigError(f"num_experts_per_tok {k} must be in [1, num_local_experts ({experts})] for {arch}")
    kv = int(hf["num_key_value_heads"])
    hf = {**hf, "num_attention_heads": kv * k, "head_dim": int(field(hf, "kv_channels", 128))}
    fields = common_fields(hf, arch)
    return ModelConfig(
        **fields,
        activation=activation_name(hf["activation_function"] or "silu"),
        layer_windows=uniform_windows(hf, arch, fields["num_layers"], 0),
        num_experts=experts,
        experts_per_token=k,
        moe_intermediate_size=fields["intermediate_size"],
    )


REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
FAMILY = Family("jetmoe", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer, required=REQUIRED)
