"""Baidu ERNIE 4.5 MoE (Ernie4_5_MoeForCausalLM: ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B).

ERNIE 4.5's attention (`ernie4_5.py`: adjacent-pair rotation, no biases) over a pre-norm layer whose
MLP is routed experts in the layers transformers builds so: i in [moe_layer_start_index,
moe_layer_end_index] (-1: the last layer) with (i + 1) a multiple of moe_layer_interval; the others
keep a dense MLP of `intermediate_size`. The router is float32 (as transformers keeps it): softmax
over every expert, the top `moe_k` chosen by probability plus `e_score_correction_bias` (stored as
[1, E] under `moe_statics`), weighted by their unbiased probabilities renormalised to sum to 1 (the
sum clamped at `moe_norm_min`). Beside them, `moe_num_shared_experts` ungated shared experts as one
dense MLP of that many x moe_intermediate_size units (`models.shared_expert`; none with 0). The
checkpoints' multi-token-prediction block (`model.mtp_*`, `num_nextn_predict_layers`) is not run.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, ModelConfig, field
from jaxinfer.models.ernie4_5 import ernie_fields
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import linear
from jaxinfer.models.llama import abstract_layer as dense_leaves
from jaxinfer.models.llama import decoder_layer as dense_layer
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.moe import ROUTER_AXES, abstract_moe_layer, experts_output, is_dense, pre_norm_layer
from jaxinfer.models.qwen3_moe import hf_leaves as qwen3_moe_hf_leaves
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.shared_expert import (
    SharedExpertLayerWeights,
    abstract_shared_moe_layer,
    shared_expert,
    shared_expert_hf_leaves,
)
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("Ernie4_5_MoeForCausalLM",)
# Ernie4_5_MoeConfig's defaults for fields a config leaves out; theta as its `default_theta`.
DEFAULTS = dict(num_key_value_heads=4, rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=True,
                rope_theta=500000.0, bos_token_id=1, eos_token_id=2, moe_intermediate_size=1536, moe_k=6,
                moe_num_experts=64, moe_num_shared_experts=2, moe_layer_start_index=1, moe_layer_end_index=-1,
                moe_layer_interval=1, moe_norm_min=1e-12)
ALIASES = {"num_experts": "moe_num_experts", "num_experts_per_tok": "moe_k"}  # Ernie4_5_MoeConfig's attribute_map
NORM_MIN = 1e-12  # the floor of the chosen probabilities' sum (moe_norm_min in every released config)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ErnieMoeLayerWeights(SharedExpertLayerWeights):
    """An MoE layer: a float32 router, its choice-only correction bias and (where the config has them) ungated
    shared experts (fields default to None as the parent's do)."""

    score_correction: jax.Array | None = None  # [1, E] float32: e_score_correction_bias, as stored


def abstract_layer(cfg: ModelConfig, layer: int) -> Any:
    """One layer's leaves as ArrayInfos: routed (and shared) experts, or a dense MLP in `dense_layers`."""
    if not cfg.is_moe_layer(layer):
        return dense_leaves(cfg, layer)
    routed = abstract_shared_moe_layer(cfg, gated=False) if cfg.shared_expert_intermediate_size else \
        abstract_moe_layer(cfg)
    leaves = {f.name: getattr(routed, f.name) for f in dataclasses.fields(routed)}
    D, E = cfg.hidden_size, cfg.num_experts
    return ErnieMoeLayerWeights(**{**leaves, "router": ArrayInfo((D, E), ROUTER_AXES, dtype="float32")},
                                score_correction=ArrayInfo((1, E), (None, None), init_value=0.0, dtype="float32"))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Qwen3-MoE's names (norms, router, attention, dense MLP, experts), the correction bias and any shared experts."""
    mlp = "model.layers.{i}.mlp."
    shared = shared_expert_hf_leaves(cfg, mlp, "shared_experts.", gated=False)
    return {
        **qwen3_moe_hf_leaves(cfg),
        "score_correction": HFLeaf(mlp + "moe_statics.e_score_correction_bias", "same", (1, cfg.num_experts)),
        **(shared if cfg.shared_expert_intermediate_size else {}),
    }


def route(logits: jax.Array, correction: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """Routing weights [N, k] (float32) and expert ids [N, k] of rows with router logits [N, E]: the top k of
    softmax + correction, weighted by their softmax probabilities renormalised."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    _, chosen = jax.lax.top_k(probs + correction.astype(jnp.float32), k)
    weights = jnp.take_along_axis(probs, chosen, axis=-1)
    return weights / jnp.maximum(jnp.sum(weights, axis=-1, keepdims=True), NORM_MIN), chosen


def moe_block(x: jax.Array, lw: ErnieMoeLayerWeights, cfg: ModelConfig, layout: Layout) -> jax.Array:
    """The routed experts' output plus any shared experts' for x [B, T, D], in x's dtype."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    logits = linear(x2.astype(jnp.float32), lw.router)  # float32 rows and router, as transformers computes them
    weights, experts = route(logits, lw.score_correction, cfg.experts_per_token)
    routed = experts_output(x2, weights, experts, lw, layout, cfg.activation).astype(x.dtype).reshape(shape)
    return routed if lw.shared_gate is None else routed + shared_expert(x, lw, cfg.activation)


def decoder_layer(cfg: ModelConfig, x, cache, lw, layer: int, positions, rope: RopeTables):
    """The MoE layer, or ERNIE's dense (Llama) layer."""
    if is_dense(lw):
        return dense_layer(cfg, x, cache, lw, layer, positions, rope)
    return pre_norm_layer(cfg, x, cache, lw, layer, positions, rope, lambda h, layout: moe_block(h, lw, cfg, layout))


def dense_layers(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """The layers transformers builds with a dense MLP: outside [start, end] or off the interval."""
    start, end, interval = (int(hf[key]) for key in ("moe_layer_start_index", "moe_layer_end_index",
                                                      "moe_layer_interval"))
    if interval < 1:
        raise ConfigError(f"moe_layer_interval {interval} must be >= 1 (every interval-th layer has experts)")
    end = num_layers - 1 if end == -1 else end
    return tuple(i for i in range(num_layers) if not (start <= i <= end and (i + 1) % interval == 0))


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an ERNIE 4.5 MoE HF config (fields it leaves out or nulls take Ernie4_5_MoeConfig's defaults)."""
    hf = {**DEFAULTS, **{ALIASES.get(key, key): value for key, value in hf.items() if value is not None}}
    for key in ("moe_k", "moe_num_experts", "moe_num_shared_experts"):
        if isinstance(hf[key], (list, tuple)):
            raise ConfigError(f"{key} {hf[key]!r} is not supported for {arch}: one number (lists are "
                              "ERNIE-4.5-VL's text and vision experts)")
    if float(hf["moe_norm_min"]) != NORM_MIN:
        raise ConfigError(f"moe_norm_min {hf['moe_norm_min']} is not supported for {arch}: the routing weights' "
                          f"sum is floored at {NORM_MIN} (every released config's)")
    shared = int(hf["moe_num_shared_experts"])
    if shared < 0:
        raise ConfigError(f"moe_num_shared_experts {shared} must be >= 0")
    fields = ernie_fields(hf, arch)
    moe = moe_fields({**hf, "num_experts_per_tok": hf["moe_k"]}, "moe_num_experts", int(hf["moe_intermediate_size"]))
    if not 0 < moe["experts_per_token"] <= moe["num_experts"]:
        raise ConfigError(f"moe_k {moe['experts_per_token']} must be between 1 and the {moe['num_experts']} experts "
                          "(moe_num_experts)")
    return ModelConfig(
        **fields,
        norm_topk_prob=True,
        dense_layers=dense_layers(hf, fields["num_layers"]),
        shared_expert_intermediate_size=shared * moe["moe_intermediate_size"],
        mtp_layers=int(field(hf, "num_nextn_predict_layers", 0)),
        **moe,
    )


FAMILY = Family("ernie4_5_moe", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
