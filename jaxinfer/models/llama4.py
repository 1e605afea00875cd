"""Llama 4 (Scout, Maverick): the text model of Llama4ForConditionalGeneration, or Llama4ForCausalLM.

A pre-norm layer like Llama's, with:
- rotary embeddings on the layers `no_rope_layers` marks 1, in complex (adjacent-pair) form
  (`cfg.rope_interleaved`) with Llama 3 scaling; those layers attend within chunks of
  `attention_chunk_size` positions (`cfg.layer_chunks`, `key_span`), and with `use_qk_norm` their q
  and k are RMS-normalised without a weight after the rotation (`cfg.qk_l2_norm`);
- the other (NoPE) layers attend to every key, queries scaled by 1 + attn_scale * log(1 + floor((p + 1) /
  floor_scale)) with `attn_temperature_tuning` (`cfg.query_scale_beta`, `cfg.query_scale_period`);
- on `moe_layers` (every `interleave_moe_layer_step`-th layer by default) routed experts beside an ungated
  shared expert, elsewhere a dense MLP of `intermediate_size_mlp`. The router takes the top k logits and
  scales each chosen expert's INPUT by sigmoid(logit) (not its output: the experts are not linear); the
  experts' gate and up sit in one [E, D, 2F] tensor (`gate_up_proj`), read as its halves.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields
from jaxinfer.models.attention import attend
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import linear
from jaxinfer.models.llama import abstract_layer as dense_leaves
from jaxinfer.models.mlp import gated_mlp, mlp_hf_leaves
from jaxinfer.models.moe import experts_output, is_dense
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import CosSin, RopeTables
from jaxinfer.models.self_attention import (
    HIDDEN,
    Q_HEADS,
    attention_hf_leaves,
    project_qkv,
    query_temperature,
)
from jaxinfer.models.shared_expert import abstract_shared_moe_layer, shared_expert, shared_expert_hf_leaves
from jaxinfer.parallel.sharding import Layout

CONDITIONAL = "Llama4ForConditionalGeneration"
ARCHITECTURES = ("Llama4ForCausalLM", CONDITIONAL)
LAYER_TYPES = ("chunked_attention", "full_attention")
# Llama4TextConfig's defaults for the fields a config may leave out (or null) that this family reads itself.
HF_DEFAULTS = dict(hidden_act="silu", max_position_embeddings=131072, rms_norm_eps=1e-5, bos_token_id=1,
                   eos_token_id=2, rope_theta=500000.0, intermediate_size_mlp=16384, num_local_experts=16,
                   num_experts_per_tok=1, interleave_moe_layer_step=1, use_qk_norm=True, no_rope_layer_interval=4,
                   attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1, attention_bias=False)
HEAD_DIM, KV_HEADS, CHUNK = 128, 8, 8192  # defaults where a null means something else (see _with_defaults)


def abstract_layer(cfg: ModelConfig, layer: int) -> Any:
    """One layer's leaves as ArrayInfos: routed experts and the shared expert, or a dense MLP off `moe_layers`."""
    return abstract_shared_moe_layer(cfg, gated=False) if cfg.is_moe_layer(layer) else dense_leaves(cfg, layer)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives in a Llama4ForCausalLM checkpoint (a Llama4ForConditionalGeneration one puts
    `language_model.` before every name: `text_part`)."""
    D, E, F = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    layer = "model.layers.{i}."
    ff = layer + "feed_forward."
    return {
        "attn_norm": HFLeaf(layer + "input_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf(layer + "post_attention_layernorm.weight", "same", (D,)),
        **attention_hf_leaves(cfg),
        **mlp_hf_leaves(D, cfg.intermediate_size, ff),
        "router": HFLeaf(ff + "router.weight", "transpose", (E, D)),
        "moe_gate": HFLeaf(ff + "experts.gate_up_proj", "columns", (E, D, 2 * F)),
        "moe_up": HFLeaf(ff + "experts.gate_up_proj", "columns", (E, D, 2 * F), row_offset=F),
        "moe_down": HFLeaf(ff + "experts.down_proj", "same", (E, F, D)),
        **shared_expert_hf_leaves(cfg, ff, gated=False),
    }


def l2_norm(x: jax.Array, eps: float) -> jax.Array:
    """x RMS-normalised over its last axis in float32, without a weight (Llama4TextL2Norm)."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def attention(
    cfg: ModelConfig, h: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: CosSin | None
) -> tuple[jax.Array, Any]:
    """Attention of the normed input h [B, T, D]: rotary layers rotate (then L2-norm) q and k and attend within
    their chunk; NoPE layers (rope None) scale their queries by the position's temperature and attend to all."""
    layout = cache.layout
    q, k, v = project_qkv(h, lw, cfg, rope, layout)
    if rope is not None and cfg.qk_l2_norm:
        q, k = l2_norm(q, cfg.rms_norm_eps), l2_norm(k, cfg.rms_norm_eps)
    if rope is None and cfg.query_scale_beta:  # transformers counts positions from 1 here, Ministral 3 from 0
        scale = query_temperature(positions + 1, cfg.query_scale_beta, cfg.query_scale_period)
        q = (q.astype(jnp.float32) * scale).astype(q.dtype)
    cache = cache.write(layer, k, v, positions)
    attn = attend(q, cache, layer, positions, cfg.layer_windows[layer], scale=cfg.attn_scale,
                  chunk=cfg.layer_chunks[layer])
    out = linear(layout.constrain(attn, Q_HEADS), lw.wo, contract=2)
    return (out if lw.bo is None else out + lw.bo), cache


def routed_experts(h: jax.Array, lw: Any, cfg: ModelConfig, layout: Layout) -> jax.Array:
    """The routed experts' summed output for h [B, T, D]: each token's top-k experts (by router logit) each
    run on the token scaled by sigmoid(logit), in h's dtype as transformers rounds it."""
    shape = h.shape
    x = h.reshape(-1, shape[-1])
    top, experts = jax.lax.top_k(linear(x, lw.router), cfg.experts_per_token)
    scores = jax.nn.sigmoid(top.astype(jnp.float32)).astype(x.dtype)
    n, k = experts.shape
    # One row per (token, choice), each its own single-expert route of weight 1: the shared grouped matmul
    # (and its expert-parallel shard_map) runs them; the k outputs are then added.
    rows = (x[:, None, :] * scores[:, :, None]).reshape(n * k, -1)
    out = experts_output(rows, jnp.ones((n * k, 1), jnp.float32), experts.reshape(n * k, 1), lw, layout,
                         cfg.activation)
    return out.reshape(n, k, -1).sum(axis=1).astype(h.dtype).reshape(shape)


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: RopeTables
) -> tuple[jax.Array, Any]:
    """One pre-norm block: attention, then the dense MLP or the routed experts plus the shared expert."""
    layout = cache.layout
    h = rms_norm(x, lw.attn_norm, cfg.rms_norm_eps)
    out, cache = attention(cfg, h, cache, lw, layer, positions, rope.for_layer(layer))
    x = layout.constrain(x + out, HIDDEN)
    h = rms_norm(x, lw.mlp_norm, cfg.rms_norm_eps)
    if is_dense(lw):
        mlp = gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation)
    else:
        mlp = routed_experts(h, lw, cfg, layout) + shared_expert(h, lw, cfg.activation)
    return layout.constrain(x + mlp, HIDDEN), cache


def _with_defaults(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The config with Llama4TextConfig's defaults filled in as transformers fills them: an absent head_dim is
    128 and a null one hidden / heads; absent KV heads are 8 and null ones the query heads; an absent
    attention_chunk_size is 8192 and a null one none (every layer full attention)."""
    out = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    heads = int(hf["num_attention_heads"])
    out["head_dim"] = HEAD_DIM if "head_dim" not in hf else hf["head_dim"] or int(hf["hidden_size"]) // heads
    out["num_key_value_heads"] = KV_HEADS if "num_key_value_heads" not in hf else hf["num_key_value_heads"] or heads
    out["attention_chunk_size"] = hf.get("attention_chunk_size", CHUNK)
    return out


def _rope_layers(hf: Mapping[str, Any], num_layers: int) -> list[int]:
    """`no_rope_layers` (1: rotary, 0: NoPE), one per layer; transformers' default: NoPE every interval-th."""
    interval = int(hf["no_rope_layer_interval"])
    flags = hf.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(num_layers)]
    if len(flags) != num_layers or not set(flags) <= {0, 1}:
        raise ConfigError(f"no_rope_layers {flags!r} must give 1 (rotary) or 0 (NoPE) for each of the "
                          f"{num_layers} layers")
    return [int(f) for f in flags]


def _layer_chunks(hf: Mapping[str, Any], rope_layers: list[int]) -> tuple[int, ...]:
    """Each layer's attention chunk: `attention_chunk_size` on `layer_types`' chunked layers (by default the
    rotary ones), 0 on full-attention layers."""
    chunk = hf["attention_chunk_size"]
    types = hf.get("layer_types") or ["chunked_attention" if r and chunk is not None else "full_attention"
                                      for r in rope_layers]
    if len(types) != len(rope_layers) or not set(types) <= set(LAYER_TYPES):
        raise ConfigError(f"layer_types {types!r} must list one of {list(LAYER_TYPES)} for each of the "
                          f"{len(rope_layers)} layers")
    if "chunked_attention" in types and not (isinstance(chunk, int) and chunk > 0):
        raise ConfigError(f"attention_chunk_size {chunk!r} must be a positive number of tokens: layer_types "
                          f"{types!r} has chunked_attention layers")
    return tuple(chunk if t == "chunked_attention" else 0 for t in types)


def _moe_layers(hf: Mapping[str, Any], num_layers: int) -> list[int]:
    """`moe_layers`, else every `interleave_moe_layer_step`-th layer (the step's last, as transformers counts)."""
    step = int(hf["interleave_moe_layer_step"])
    if hf.get("moe_layers") is None and step < 1:
        raise ConfigError(f"interleave_moe_layer_step {step} must be >= 1 (1: every layer MoE)")
    layers = hf["moe_layers"] if hf.get("moe_layers") is not None else list(range(step - 1, num_layers, step))
    if any(not 0 <= int(i) < num_layers for i in layers):
        raise ConfigError(f"moe_layers {layers!r} must be layer indices below num_hidden_layers {num_layers}")
    return [int(i) for i in layers]


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Llama 4 text config (Llama4ForConditionalGeneration's `text_config`, which the registry
    hands over as the config: `text_part`)."""
    hf = _with_defaults(hf)
    fields = common_fields(hf, arch)
    layers = fields["num_layers"]
    rope_layers = _rope_layers(hf, layers)
    moe = set(_moe_layers(hf, layers))
    bias = bool(hf["attention_bias"])
    tuning = bool(hf["attn_temperature_tuning"])
    if tuning and int(hf["floor_scale"]) < 1:
        raise ConfigError(f"floor_scale {hf['floor_scale']!r} must be >= 1 with attn_temperature_tuning (the "
                          "NoPE layers' queries scale up once per floor_scale positions)")
    experts_size = fields["intermediate_size"]  # the experts' and the shared expert's; dense layers have their own
    fields["intermediate_size"] = int(hf["intermediate_size_mlp"])
    return ModelConfig(
        **fields,
        rope_interleaved=True,
        nope_layers=tuple(i for i, r in enumerate(rope_layers) if not r),
        layer_chunks=_layer_chunks(hf, rope_layers),
        qk_l2_norm=bool(hf["use_qk_norm"]),
        query_scale_beta=float(hf["attn_scale"]) if tuning else 0.0,
        query_scale_period=int(hf["floor_scale"]),
        qkv_bias=bias,
        o_bias=bias,
        activation=activation_name(hf["hidden_act"]),
        num_experts=int(hf["num_local_experts"]),
        experts_per_token=int(hf["num_experts_per_tok"]),
        moe_intermediate_size=experts_size,
        shared_expert_intermediate_size=experts_size,
        dense_layers=tuple(i for i in range(layers) if i not in moe),
    )


FAMILY = Family("llama4", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
