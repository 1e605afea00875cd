"""Zyphra ZAYA1 (`ZayaForCausalLM`): CCA attention over the pages beside a conv state, then one routed expert (or
none) chosen by a router whose state passes from layer to layer.

As transformers' modular_zaya has it:

- The embeddings are shifted and scaled per channel (`input_hidden_states_bias` / `_scale`, held by decoder layer
  0) before the first layer.
- Attention: q, k and v from the CCA projection (models/cca: two causal convs over the q/k projections, residual
  paths, half the value heads from the previous token), q and k scaled to L2 norm sqrt(head_dim) per head and k
  times a learned temperature per K/V head, rotated over the leading `partial_rotary_factor` of each head with each
  layer type's base ("hybrid" full, "hybrid_sliding" over `sliding_window`), o_proj. Every layer keeps K/V pages
  and a conv state (`StateSpace.short_conv` with `parallel_attention`: the last t0 + t1 - 2 tokens' q/k projections
  and delayed values).
- Each residual add is (out + b) * s + (residual + b') * s' per channel (`post_*_residual_scale`).
- The router: down_proj to `router_hidden_size` (plus, after layer 0, the previous layer's router state times
  `router_states_scale`; that sum is the state handed on), RMSNorm, two GELU layers, a logit per expert and one for
  "skip"; the top-1 of softmax + `balancing_biases` (for choosing only) weighted by its probability; "skip" adds
  nothing. Experts: Qwen3-MoE's fused gate_up_proj / down_proj.

The residual stream stays in the model's dtype (transformers keeps it float32 for a bfloat16 model: a 16-bit run
here rounds it per layer). `attention_bias` (its delayed value's first token would read the bias) and
`num_experts_per_tok` other than 1 (transformers refuses it too) are refused by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.cache.state_pool import read_state, write_state
from jaxinfer.config.model import REQUIRED_FIELDS, ConfigError, ModelConfig, activation_name, common_fields
from jaxinfer.config.rope_scaling import RopeScaling, rope_fields
from jaxinfer.config.state_space import StateSpace
from jaxinfer.config.zaya import ZayaFields
from jaxinfer.models.attention import attend
from jaxinfer.models.cca import cca_norm, cca_qkv, conv_channels
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.moe import DOWN_AXES, GATE_AXES, experts_output
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.placed_layer import PlacedLayer, placed
from jaxinfer.models.rope import RopeTables, apply_rope
from jaxinfer.models.self_attention import HIDDEN, Q_HEADS
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("ZayaForCausalLM",)
KINDS = {"hybrid": 0, "hybrid_sliding": 1}  # layer_types: full, sliding
THETAS = {"hybrid": 5_000_000.0, "hybrid_sliding": 10_000.0}
LAYER = "model.layers.{i}."
# ZayaConfig's defaults for the fields a config may leave out (or null) where ours differ.
DEFAULTS = dict(vocab_size=262272, hidden_size=2048, num_hidden_layers=40, num_attention_heads=8, num_key_value_heads=2,
                head_dim=128, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
                moe_intermediate_size=2048, num_experts=16, num_experts_per_tok=1, router_hidden_size=256, cca_time0=2,
                cca_time1=2, attention_bias=False, lm_head_bias=False, bos_token_id=2, eos_token_id=106)
# a residual add's four [D] vectors: ours, transformers' (ZayaResidualScaling)
RESIDUALS = {"out_bias": "hidden_states_bias", "out_scale": "hidden_states_scale", "res_bias": "residual_bias",
             "res_scale": "residual_scale"}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ZayaLayer:
    """One ZAYA layer (H, KV, K the heads; C = (H + KV) K the conv channels; R the router's width)."""

    attn_norm: jax.Array  # [D]
    wq: Weight  # [D, H * K]
    wk: Weight  # [D, KV * K]
    wv_now: Weight  # [D, KV * K / 2]
    wv_prev: Weight  # [D, KV * K / 2]
    wo: Weight  # [H, K, D]
    conv_dw: jax.Array  # [C, 1, t0]
    conv_dw_bias: jax.Array  # [C]
    conv_grouped: jax.Array  # [C, K, t1]
    conv_grouped_bias: jax.Array  # [C]
    key_temp: jax.Array  # [KV]
    mlp_norm: jax.Array  # [D]
    router_down: Weight  # [D, R]
    router_down_bias: jax.Array  # [R]
    router_norm: jax.Array  # [R]
    router_fc1: Weight  # [R, R]
    router_fc1_bias: jax.Array  # [R]
    router_fc2: Weight  # [R, R]
    router_fc2_bias: jax.Array  # [R]
    router_out: Weight  # [R, E + 1]
    balancing: jax.Array  # [E + 1] float32
    moe_gate: Any  # [E, D, F]
    moe_up: Any  # [E, D, F]
    moe_down: Any  # [E, F, D]
    attn_out_bias: jax.Array  # [D] the attention add's (post_attention_residual_scale)
    attn_out_scale: jax.Array  # [D]
    attn_res_bias: jax.Array  # [D]
    attn_res_scale: jax.Array  # [D]
    mlp_out_bias: jax.Array  # [D] the MLP add's (post_mlp_residual_scale)
    mlp_out_scale: jax.Array  # [D]
    mlp_res_bias: jax.Array  # [D]
    mlp_res_scale: jax.Array  # [D]
    router_carry: jax.Array | None = None  # [R] router_states_scale (not in layer 0)
    input_bias: jax.Array | None = None  # [D] layer 0: the embeddings' shift
    input_scale: jax.Array | None = None  # [D] and scale

    PROJECTIONS: ClassVar[dict[str, int]] = {"wq": 1, "wk": 1, "wv_now": 1, "wv_prev": 1, "wo": 2}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = ()


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class RoutedStream:
    """What a layer hands the next: the residual stream and its router's state."""

    hidden: jax.Array  # [B, T, D]
    router: jax.Array  # [B, T, R]


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> ZayaLayer:
    """Layer `layer`'s leaves as ArrayInfos."""
    D, H, KV, K = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    E, F = cfg.num_experts, cfg.moe_intermediate_size
    C, V = conv_channels(cfg)
    taps, R = cfg.zaya.cca_taps, cfg.zaya.router_hidden_size
    vec = lambda n, axes=(None,), value=None: ArrayInfo((n,), axes, init_value=value)  # noqa: E731
    adds = {f"{sub}_{name}": vec(D, ("embed",), 1.0 if name.endswith("scale") else 0.0)
            for sub in ("attn", "mlp") for name in RESIDUALS}
    return ZayaLayer(
        attn_norm=vec(D, ("embed",), 1.0), mlp_norm=vec(D, ("embed",), 1.0),
        wq=ArrayInfo((D, H * K), ("embed", None)), wk=ArrayInfo((D, KV * K), ("embed", None)),
        wv_now=ArrayInfo((D, V), ("embed", None)), wv_prev=ArrayInfo((D, V), ("embed", None)),
        wo=ArrayInfo((H, K, D), ("q_heads", "head_dim", "embed")),
        conv_dw=ArrayInfo((C, 1, taps[0]), (None, None, None)), conv_dw_bias=vec(C),
        conv_grouped=ArrayInfo((C, K, taps[1]), (None, None, None)), conv_grouped_bias=vec(C),
        key_temp=vec(KV), **adds,
        router_down=ArrayInfo((D, R), ("embed", None)), router_down_bias=vec(R), router_norm=vec(R, value=1.0),
        router_fc1=ArrayInfo((R, R), (None, None)), router_fc1_bias=vec(R),
        router_fc2=ArrayInfo((R, R), (None, None)), router_fc2_bias=vec(R),
        router_out=ArrayInfo((R, E + 1), (None, None)), balancing=ArrayInfo((E + 1,), (None,), dtype="float32"),
        moe_gate=ArrayInfo((E, D, F), GATE_AXES), moe_up=ArrayInfo((E, D, F), GATE_AXES),
        moe_down=ArrayInfo((E, F, D), DOWN_AXES),
        router_carry=vec(R, value=1.0) if layer else None,
        input_bias=vec(D, ("embed",)) if layer == 0 else None,
        input_scale=vec(D, ("embed",), 1.0) if layer == 0 else None,
    )


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives."""
    D, H, KV, K = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    E, F, R = cfg.num_experts, cfg.moe_intermediate_size, cfg.zaya.router_hidden_size
    C, V = conv_channels(cfg)
    t0, t1 = cfg.zaya.cca_taps
    cca, gate, experts = LAYER + "self_attn.qkv_proj.", LAYER + "mlp.gate.", LAYER + "mlp.experts."
    router = gate + "router_mlp."
    same = lambda name, shape: HFLeaf(name, "same", shape)  # noqa: E731
    linear_t = lambda name, shape: HFLeaf(name, "transpose", shape)  # noqa: E731
    return {
        "attn_norm": same(LAYER + "input_layernorm.weight", (D,)),
        "mlp_norm": same(LAYER + "post_attention_layernorm.weight", (D,)),
        "wq": linear_t(cca + "q_proj.weight", (H * K, D)), "wk": linear_t(cca + "k_proj.weight", (KV * K, D)),
        "wv_now": linear_t(cca + "v_proj_current.weight", (V, D)),
        "wv_prev": linear_t(cca + "v_proj_delayed.weight", (V, D)),
        "wo": HFLeaf(LAYER + "self_attn.o_proj.weight", "out_heads", (D, H * K), H, K),
        "conv_dw": same(cca + "conv_qk_depthwise.weight", (C, 1, t0)),
        "conv_dw_bias": same(cca + "conv_qk_depthwise.bias", (C,)),
        "conv_grouped": same(cca + "conv_qk_grouped.weight", (C, K, t1)),
        "conv_grouped_bias": same(cca + "conv_qk_grouped.bias", (C,)),
        "key_temp": same(LAYER + "self_attn.qk_norm.temp", (KV,)),
        "router_down": linear_t(gate + "down_proj.weight", (R, D)),
        "router_down_bias": same(gate + "down_proj.bias", (R,)),
        "router_carry": same(gate + "router_states_scale", (R,)),
        "router_norm": same(router + "norm.weight", (R,)),
        "router_fc1": linear_t(router + "fc1.weight", (R, R)), "router_fc1_bias": same(router + "fc1.bias", (R,)),
        "router_fc2": linear_t(router + "fc2.weight", (R, R)), "router_fc2_bias": same(router + "fc2.bias", (R,)),
        "router_out": linear_t(router + "out_proj.weight", (E + 1, R)),
        "balancing": same(gate + "balancing_biases", (E + 1,)),
        "moe_gate": linear_t(experts + "gate_up_proj", (E, 2 * F, D)),
        "moe_up": HFLeaf(experts + "gate_up_proj", "transpose", (E, 2 * F, D), row_offset=F),
        "moe_down": linear_t(experts + "down_proj", (E, D, F)),
        "input_bias": same("model.input_hidden_states_bias", (D,)),
        "input_scale": same("model.input_hidden_states_scale", (D,)),
        **{f"{sub}_{name}": same(f"{LAYER}post_{stored_sub}_residual_scale.{stored}", (D,))
           for sub, stored_sub in (("attn", "attention"), ("mlp", "mlp")) for name, stored in RESIDUALS.items()},
    }


def borrowed_leaves(cfg: ModelConfig, layers: list[ZayaLayer], layer: int) -> PlacedLayer:
    """Layer `layer`'s weights, marked where it is the last (it hands on the stream alone)."""
    return placed(layers[layer], last=layer == cfg.num_layers - 1)


def attention(cfg: ModelConfig, h: jax.Array, cache: Any, lw: ZayaLayer, layer: int, positions: jax.Array,
              rope: Any) -> tuple[jax.Array, Any]:
    """CCA's q, k, v (the conv state read and written), normed and rotated, over the pages: [B, T, D]."""
    state = read_state(cache, layer, cfg, h.shape[0], h.shape[1])
    q, k, v, state = cca_qkv(cfg, lw, h, positions, state)
    q, k = cca_norm(q, k, lw.key_temp)
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    cache = write_state(cache.write(layer, k, v, positions), layer, state)
    out = attend(q, cache, layer, positions, cfg.layer_windows[layer])
    return linear(cache.layout.constrain(out, Q_HEADS), lw.wo, contract=2), cache


def _added(out: jax.Array, residual: jax.Array, lw: ZayaLayer, sub: str) -> jax.Array:
    """(out + b) * s + (residual + b') * s', each per channel, with sublayer `sub`'s vectors."""
    out_bias, out_scale, res_bias, res_scale = (getattr(lw, f"{sub}_{name}").astype(out.dtype) for name in RESIDUALS)
    return (out + out_bias) * out_scale + (residual + res_bias) * res_scale


def routed(cfg: ModelConfig, h: jax.Array, carried: jax.Array | None, lw: ZayaLayer, layout: Any
           ) -> tuple[jax.Array, jax.Array]:
    """The chosen expert's output for h [B, T, D] (zeros where "skip" wins) and the router state handed on."""
    state = linear(h, lw.router_down) + lw.router_down_bias.astype(h.dtype)
    if lw.router_carry is not None and carried is not None:
        state = state + carried * lw.router_carry.astype(h.dtype)
    r = rms_norm(state, lw.router_norm, cfg.rms_norm_eps)
    r = jax.nn.gelu(linear(r, lw.router_fc1) + lw.router_fc1_bias.astype(r.dtype), approximate=False)
    r = jax.nn.gelu(linear(r, lw.router_fc2) + lw.router_fc2_bias.astype(r.dtype), approximate=False)
    probs = jax.nn.softmax(linear(r, lw.router_out).astype(jnp.float32), axis=-1)  # [B, T, E + 1]
    choice = jnp.argmax(probs + lw.balancing.astype(jnp.float32), axis=-1)
    weight = jnp.take_along_axis(probs, choice[..., None], axis=-1)
    skip = choice[..., None] == cfg.num_experts
    weight, choice = jnp.where(skip, 0.0, weight), jnp.where(skip, 0, choice[..., None])
    x2 = h.reshape(-1, h.shape[-1])
    out = experts_output(x2, weight.reshape(-1, 1).astype(h.dtype), choice.reshape(-1, 1), lw, layout, cfg.activation)
    return out.astype(h.dtype).reshape(h.shape), state


def decoder_layer(
    cfg: ModelConfig, x: jax.Array | RoutedStream, cache: Any, place: PlacedLayer, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array | RoutedStream, Any]:
    """norm -> CCA attention -> scaled add, norm -> the routed expert -> scaled add; the router state rides along."""
    lw, layout, eps = place.weights, cache.layout, cfg.rms_norm_eps
    if isinstance(x, jax.Array):  # layer 0: the embeddings shifted and scaled, no router state yet
        x = RoutedStream((x + lw.input_bias.astype(x.dtype)) * lw.input_scale.astype(x.dtype), None)
    out, cache = attention(cfg, rms_norm(x.hidden, lw.attn_norm, eps), cache, lw, layer, positions,
                           rope.for_layer(layer))
    hidden = layout.constrain(_added(out, x.hidden, lw, "attn"), HIDDEN)
    out, state = routed(cfg, rms_norm(hidden, lw.mlp_norm, eps), x.router, lw, layout)
    hidden = layout.constrain(_added(out, hidden, lw, "mlp"), HIDDEN)
    return (hidden if place.at("last") else RoutedStream(hidden, state)), cache


def rope_by_kind(hf: Mapping[str, Any], head_dim: int, arch: str) -> dict[str, Any]:
    """Each layer type's rope (ZayaConfig's defaults where absent): the full layers' as the config's, the sliding
    ones' base and rotated dims as the local ones (unscaled)."""
    params = hf.get("rope_parameters") or {}
    by_kind = {kind: {"rope_type": "default", "rope_theta": THETAS[kind], "partial_rotary_factor": 0.5,
                      **(params.get(kind) or {})} for kind in KINDS}
    theta, scaling = rope_fields(hf, by_kind["hybrid"])
    local_theta, local_scaling = rope_fields(hf, by_kind["hybrid_sliding"])
    if local_scaling != RopeScaling():
        raise ConfigError(f"rope_parameters.hybrid_sliding {by_kind['hybrid_sliding']!r} is not supported for {arch}: "
                          "the sliding layers take the default rope with their own rope_theta")
    dims = {kind: int(head_dim * float(p["partial_rotary_factor"])) for kind, p in by_kind.items()}
    return dict(rope_theta=theta, rope_scaling=scaling, local_rope_theta=local_theta, rotary_dim=dims["hybrid"],
                local_rotary_dim=dims["hybrid_sliding"])


def _refuse(hf: Mapping[str, Any], arch: str) -> None:
    """The settings this port does not run, by name."""
    if hf["attention_bias"]:
        raise ConfigError(f"attention_bias=True is not supported for {arch} (no release sets it; the first token's "
                          "delayed value would read v_proj_delayed's bias)")
    if int(hf["num_experts_per_tok"]) != 1:
        raise ConfigError(f"num_experts_per_tok {hf['num_experts_per_tok']} is not supported for {arch}: 1 only "
                          "(as transformers runs it)")
    if int(hf["cca_time0"]) < 1 or int(hf["cca_time1"]) < 1 or int(hf["cca_time0"]) + int(hf["cca_time1"]) < 3:
        raise ConfigError(f"cca_time0 {hf['cca_time0']} and cca_time1 {hf['cca_time1']} are not supported for "
                          f"{arch}: each >= 1, together >= 3 (a token's conv reads at least the token before)")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a ZAYA HF config (fields it leaves out or nulls take ZayaConfig's defaults)."""
    ids = {key: hf.get(key, DEFAULTS[key]) for key in ("bos_token_id", "eos_token_id")}  # null: none, as given
    hf = {**DEFAULTS, **{key: value for key, value in hf.items() if value is not None}, **ids}
    _refuse(hf, arch)
    fields = common_fields({**hf, "rope_parameters": None, "intermediate_size": 0}, arch)
    layers = fields["num_layers"]
    kinds = hf.get("layer_types") or ["hybrid"] * layers
    if len(kinds) != layers or not set(kinds) <= set(KINDS):
        raise ConfigError(f"layer_types {kinds!r} must give one of {list(KINDS)} for each of the {layers} layers of "
                          f"{arch}")
    window = hf.get("sliding_window")
    if "hybrid_sliding" in kinds and (window is None or int(window) < 1):
        raise ConfigError(f"sliding_window {window!r} is not supported for {arch}'s hybrid_sliding layers: >= 1")
    taps = (int(hf["cca_time0"]), int(hf["cca_time1"]))
    C, V = (fields["num_heads"] + fields["num_kv_heads"]) * fields["head_dim"], fields["num_kv_heads"] * \
        fields["head_dim"] // 2
    state = dataclasses.replace(StateSpace.short_conv(tuple(range(layers)), C + V, sum(taps) - 1, False),
                                parallel_attention=True)
    return ModelConfig(
        **{**fields, **rope_by_kind(hf, fields["head_dim"], arch)},
        layer_windows=tuple(int(window) if kind == "hybrid_sliding" else 0 for kind in kinds),
        lm_head_bias=bool(hf["lm_head_bias"]), activation=activation_name(hf.get("hidden_act") or "silu"),
        num_experts=int(hf["num_experts"]), experts_per_token=1,
        moe_intermediate_size=int(hf["moe_intermediate_size"]), state_space=state,
        zaya=ZayaFields(router_hidden_size=int(hf["router_hidden_size"]), cca_taps=taps),
    )


FAMILY = Family("zaya", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                required=tuple(key for key in REQUIRED_FIELDS if key != "intermediate_size"),  # no dense MLP
                borrowed_leaves=borrowed_leaves)
