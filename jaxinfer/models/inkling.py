"""Thinking Machines Inkling (`InklingForCausalLM`, text): attention with a query-conditioned relative position bias
and short convolutions around it, before a dense MLP or sink-routed experts.

As transformers' modeling_inkling has it:

- No rotary embedding. Attention (models/inkling_attention) adds each query's relative position bias, its keys and
  values first pass through causal depthwise convolutions (`k_sconv`, `v_sconv`), then q and k are RMS-normed per
  head and scored by 1 / head_dim. `layer_types` "hybrid_sliding" layers (by default all but every sixth) attend
  within `sliding_window_size` with their own head counts and dims (`swa_*`: `cfg.kv_shape`); "hybrid" ones see
  every earlier token, their bias reaching `rel_extent` back.
- The attention output and the MLP output each pass a short convolution too (`attn_sconv`, `mlp_sconv`); every
  convolution is float32, adds its input back, and keeps the last `conv_kernel_size` - 1 inputs per request: every
  layer is a state layer that also keeps K/V pages (`StateSpace.short_conv`, `parallel_attention`), its conv state
  the four convs' channels side by side [attn D | mlp D | keys | values] (`conv_parts`). Prefix caching and
  speculative decoding are refused for it, as for every state model.
- The MLP is a gated one times a learned `global_scale` (`mlp_layer_types` "dense"), or `num_experts_per_tok` of
  `n_routed_experts` experts chosen by float32 sigmoid score plus `e_score_correction_bias`, their weights and the
  `n_shared_experts` shared experts' normalised together over their log-sigmoid logits (the shared experts a sink),
  times `route_scale` and the router's `global_scale`.
- The embeddings are RMS-normed (`embed_tokens.embed_norm`, held and applied by layer 0) and the final hidden
  states divided by `logits_mup_width_multiplier` (`cfg.logits_scaling`). The head is never tied.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax

from jaxinfer.cache.state_pool import read_state, write_state
from jaxinfer.config.inkling import InklingFields
from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.inkling_attention import cached_attention, log_scale
from jaxinfer.models.inkling_layer import Convs, InklingLayer, abstract_layer, conv_parts, layer_hf_leaves, moe_mlp
from jaxinfer.models.layers import linear
from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, Q_HEADS
from jaxinfer.models.ssd_chunks import segments

ARCHITECTURES = ("InklingForCausalLM",)
LAYER_TYPES = ("hybrid", "hybrid_sliding")
MLP_LAYER_TYPES = ("dense", "sparse")
# InklingTextConfig's defaults for the fields a config may leave out (or null).
DEFAULTS = dict(num_key_value_heads=8, head_dim=128, swa_num_key_value_heads=16, swa_head_dim=128,
                sliding_window_size=512, d_rel=16, rel_extent=1024, log_scaling_alpha=0.1, conv_kernel_size=4,
                moe_intermediate_size=3072, n_routed_experts=256, num_experts_per_tok=6, n_shared_experts=2,
                route_scale=8.0, logits_mup_width_multiplier=24.0, max_position_embeddings=131072, bos_token_id=1,
                eos_token_id=2, hidden_act="silu")


def embed_norm_leaf(cfg: ModelConfig) -> HFLeaf:
    """Layer 0's `embed_norm`: the embeddings' RMSNorm, stored beside them."""
    return HFLeaf("model.embed_tokens.embed_norm.weight", "same", (cfg.hidden_size,))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Layer 0's names (layer_hf_leaves gives each layer's own: the heads and MLP differ by kind)."""
    return {**layer_hf_leaves(cfg, 0), "embed_norm": embed_norm_leaf(cfg)}


def attention(cfg: ModelConfig, h: jax.Array, cache: Any, lw: InklingLayer, layer: int, positions: jax.Array,
              convs: Convs) -> tuple[jax.Array, Any, Convs]:
    """Attention of the normed h [B, T, D] (positions [B, T]), its keys and values through their convs first:
    [B, T, D], the cache after this step's keys and values, the conv state after theirs."""
    B, T, _ = h.shape
    KV, K = lw.wk.shape[1:]
    parts = conv_parts(cfg, KV * K)
    q, k, v, rel = (linear(h, w) for w in (lw.wq, lw.wk, lw.wv, lw.w_rel))
    k, convs = convs.run(parts["keys"], k.reshape(B * T, KV * K), lw.k_conv)
    v, convs = convs.run(parts["values"], v.reshape(B * T, KV * K), lw.v_conv)
    q = rms_norm(q, lw.q_norm, cfg.rms_norm_eps)
    k = rms_norm(k.reshape(B, T, KV, K), lw.k_norm, cfg.rms_norm_eps)
    cache = cache.write(layer, k, v.reshape(B, T, KV, K), positions)
    window, fields = cfg.layer_windows[layer], cfg.inkling
    scaled = fields.log_scaling_n_floor and not window  # the full layers only
    tau = log_scale(positions, fields.log_scaling_n_floor, fields.log_scaling_alpha) if scaled else None
    out = cached_attention(q, rel, lw.rel_table, cache, layer, positions, window, tau)
    return linear(cache.layout.constrain(out, Q_HEADS), lw.wo, contract=2), cache, convs


def decoder_layer(cfg: ModelConfig, x: jax.Array, cache: Any, lw: InklingLayer, layer: int, positions: jax.Array,
                  rope: RopeTables) -> tuple[jax.Array, Any]:
    """One layer: (layer 0: the embeddings normed) attention and its output conv, then the MLP and its output conv,
    each added to the residual; the four convs' state read and written once."""
    B, T, D = x.shape
    layout, eps = cache.layout, cfg.rms_norm_eps
    if lw.embed_norm is not None:
        x = rms_norm(x, lw.embed_norm, eps)
    state, flat = read_state(cache, layer, cfg, B, T), positions.reshape(-1)
    seg = segments(state.token_slots, flat, min(state.conv.shape[0], B * T))
    convs = Convs(state.conv, state.token_slots, flat, seg)
    out, cache, convs = attention(cfg, rms_norm(x, lw.attn_norm, eps), cache, lw, layer, positions, convs)
    parts = conv_parts(cfg, lw.wk.shape[1] * lw.wk.shape[2])
    out, convs = convs.run(parts["attn"], out.reshape(B * T, D), lw.attn_conv)
    x = layout.constrain(x + out.reshape(B, T, D), HIDDEN)
    h = rms_norm(x, lw.mlp_norm, eps)
    if lw.router is None:
        mixed = gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation) * lw.mlp_scale.astype(h.dtype)
    else:
        mixed = moe_mlp(h, lw, cfg, layout)
    mixed, convs = convs.run(parts["mlp"], mixed.reshape(B * T, D), lw.mlp_conv)
    cache = write_state(cache, layer, dataclasses.replace(state, conv=convs.pool))
    return layout.constrain(x + mixed.reshape(B, T, D), HIDDEN), cache


def layer_kinds(hf: Mapping[str, Any], num_layers: int, arch: str) -> list[str]:
    """`layer_types`, else sliding but at the `local_layer_ids` complement (by default every sixth layer full)."""
    local = hf.get("local_layer_ids")
    local = set(local) if local is not None else {i for i in range(num_layers) if (i + 1) % 6}
    kinds = hf.get("layer_types") or ["hybrid_sliding" if i in local else "hybrid" for i in range(num_layers)]
    if len(kinds) != num_layers or not set(kinds) <= set(LAYER_TYPES):
        raise ConfigError(f"layer_types {kinds!r} must give one of {list(LAYER_TYPES)} for each of the {num_layers} "
                          f"layers of {arch}")
    return list(kinds)


def dense_layers(hf: Mapping[str, Any], num_layers: int, arch: str) -> tuple[int, ...]:
    """The layers `mlp_layer_types` marks dense (by default the first `dense_mlp_idx`, 0)."""
    first = int(hf.get("dense_mlp_idx") or 0)
    kinds = hf.get("mlp_layer_types") or ["dense" if i < first else "sparse" for i in range(num_layers)]
    if len(kinds) != num_layers or not set(kinds) <= set(MLP_LAYER_TYPES):
        raise ConfigError(f"mlp_layer_types {kinds!r} must give one of {list(MLP_LAYER_TYPES)} for each of the "
                          f"{num_layers} layers of {arch}")
    return tuple(i for i, kind in enumerate(kinds) if kind == "dense")


def check_heads(hf: Mapping[str, Any], arch: str) -> None:
    """Refuse sliding layers with another query head count (one `num_heads` here) and a padded head."""
    heads, swa = int(hf["num_attention_heads"]), int(hf.get("swa_num_attention_heads") or hf["num_attention_heads"])
    if swa != heads:
        raise ConfigError(f"swa_num_attention_heads {swa} is not supported for {arch}: its sliding layers must have "
                          f"num_attention_heads ({heads}) query heads")
    unpadded = hf.get("unpadded_vocab_size")
    if unpadded is not None and int(unpadded) != int(hf["vocab_size"]):
        raise ConfigError(f"unpadded_vocab_size {unpadded} is not supported for {arch}: its head must have "
                          f"vocab_size ({hf['vocab_size']}) rows (null or equal)")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an Inkling text config (InklingTextConfig's defaults where a key is absent or null)."""
    hf = {**DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    dense_width = hf.get("dense_intermediate_size")
    if dense_width is not None:  # then intermediate_size is the experts' width, as transformers reads it
        hf = {**hf, "moe_intermediate_size": hf["intermediate_size"], "intermediate_size": dense_width}
    check_heads(hf, arch)
    fields = common_fields(hf, arch)
    layers = fields["num_layers"]
    kinds = layer_kinds(hf, layers, arch)
    experts, per_token = int(hf["n_routed_experts"]), int(hf["num_experts_per_tok"])
    if not 1 <= per_token <= experts or int(hf["n_shared_experts"]) < 1:
        raise ConfigError(f"num_experts_per_tok {per_token} must be in [1, n_routed_experts ({experts})] and "
                          f"n_shared_experts {hf['n_shared_experts']} >= 1 for {arch}")
    window, kernel = int(hf["sliding_window_size"]), int(hf["conv_kernel_size"])
    if window < 1 or kernel < 2:
        raise ConfigError(f"sliding_window_size {window} must be >= 1 and conv_kernel_size {kernel} >= 2 for {arch}")
    sliding = [kind == "hybrid_sliding" for kind in kinds]
    kv = [int(hf["swa_num_key_value_heads" if s else "num_key_value_heads"]) for s in sliding]
    dims = [int(hf["swa_head_dim" if s else "head_dim"]) for s in sliding]
    channels = 2 * fields["hidden_size"] + 2 * max(h * d for h, d in zip(kv, dims))
    state = dataclasses.replace(StateSpace.short_conv(tuple(range(layers)), channels, kernel, bias=False),
                                parallel_attention=True)
    floor = hf.get("log_scaling_n_floor")
    return ModelConfig(
        **{**fields, "num_kv_heads": kv[0], "head_dim": dims[0], "tie_word_embeddings": False},
        layer_kv_heads=tuple(kv), layer_head_dims=tuple(dims),
        layer_windows=tuple(window if s else 0 for s in sliding),
        nope_layers=tuple(range(layers)),
        activation=activation_name(hf["hidden_act"]),
        state_space=state,
        dense_layers=dense_layers(hf, layers, arch),
        num_experts=experts, experts_per_token=per_token, moe_intermediate_size=int(hf["moe_intermediate_size"]),
        routed_scaling_factor=float(hf["route_scale"]), logits_scaling=float(hf["logits_mup_width_multiplier"]),
        inkling=InklingFields(d_rel=int(hf["d_rel"]), rel_extent=int(hf["rel_extent"]),
                              shared_experts=int(hf["n_shared_experts"]), log_scaling_n_floor=int(floor or 0),
                              log_scaling_alpha=float(hf["log_scaling_alpha"])),
    )


FAMILY = Family("inkling", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                layer_hf_leaves=layer_hf_leaves)
