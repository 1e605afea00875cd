"""Mamba2 (`Mamba2ForCausalLM`): every layer an RMSNorm then a Mamba2 mixer, added to the residual stream.

No layer attends, so the engine keeps no K/V for it (its pages are empty) and one recurrent state per
request instead (cache/state_pool). The decoder lives under `backbone.` in its checkpoints, with the
embedding at `backbone.embeddings` and the final norm at `backbone.norm_f`. With `residual_in_fp32`
(transformers' default) the residual stream is float32 from the first layer's add on, as transformers
keeps it: each layer norms it rounded to the model's dtype, adds the mixer's output in float32, and the
final norm reads it in float32 (a 16-bit run's logits then track transformers').
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.cache.state_pool import read_state, write_state
from jaxinfer.config.generation import token_ids
from jaxinfer.config.model import ConfigError, ModelConfig, field
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.mamba2_mixer import MixerWeights, mixer, mixer_hf_leaves, mixer_leaves
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("Mamba2ForCausalLM",)
REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "head_dim", "state_size")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Mamba2Layer(MixerWeights):
    """A mixer's weights and the RMSNorm before it (always set: the default only follows the mixer's)."""

    norm: jax.Array | None = None  # [D]


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> Mamba2Layer:
    """One layer's leaves as ArrayInfos."""
    D = cfg.hidden_size
    return Mamba2Layer(norm=ArrayInfo((D,), ("embed",), init_value=1.0), **mixer_leaves(cfg.state_space, D))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives in an HF checkpoint."""
    D = cfg.hidden_size
    return {
        "norm": HFLeaf("backbone.layers.{i}.norm.weight", "same", (D,)),
        **mixer_hf_leaves(cfg.state_space, D, "backbone.layers.{i}.mixer."),
    }


def mamba_block(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, norm: jax.Array, layer: int, positions: jax.Array,
    mix: Callable[..., tuple[jax.Array, Any]] = mixer,
) -> tuple[jax.Array, Any]:
    """x plus the mixer `mix` (Mamba2's; Mamba-1's for models/mamba) of RMSNorm(x) (weights `lw`, norm weight
    `norm`), its state read and written in cache; with `residual_in_fp32` the norm reads x in the weights' dtype and
    the sum is float32."""
    fp32 = cfg.state_space.residual_in_fp32
    dtype = getattr(norm, "weight", norm).dtype  # an InvariantWeight holds its array
    state = read_state(cache, layer, cfg, x.shape[0], x.shape[1])
    h = rms_norm(x.astype(dtype) if fp32 else x, norm, cfg.rms_norm_eps)
    out, state = mix(cfg.state_space, lw, h, positions, state)
    x = x.astype(jnp.float32) + out.astype(jnp.float32) if fp32 else x + out
    return cache.layout.constrain(x, HIDDEN), write_state(cache, layer, state)


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Mamba2Layer, layer: int, positions: jax.Array, rope: RopeTables
) -> tuple[jax.Array, Any]:
    """RMSNorm, the Mamba2 mixer, the residual add."""
    return mamba_block(cfg, x, cache, lw, lw.norm, layer, positions)


def _number(value: Any) -> float:
    """A float of a config, which transformers 5 writes as {"__float__": "Infinity"} when it is not finite."""
    return float(value["__float__"]) if isinstance(value, Mapping) and "__float__" in value else float(value)


def time_step_limit(hf: Mapping[str, Any]) -> tuple[float, float]:
    """(low, high) dt is clamped to; transformers' default (0, inf) leaves it free."""
    limit = tuple(_number(v) for v in field(hf, "time_step_limit", (0.0, math.inf)))
    if len(limit) != 2 or not limit[0] <= limit[1]:
        raise ConfigError(f"time_step_limit {list(limit)!r} is not supported: give [low, high] with low <= high")
    return limit


def check_activation(hf: Mapping[str, Any], key: str, arch: str) -> None:
    """The mixer's conv activation is SiLU in every released checkpoint; refuse any other by name."""
    act = field(hf, key, "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"{key} {act!r} is not supported for {arch}'s Mamba2 mixer; supported: 'silu'")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Mamba2 HF config (the attention fields are placeholders: no layer attends)."""
    check_activation(hf, "hidden_act", arch)
    layers = int(hf["num_hidden_layers"])
    hidden = int(hf["hidden_size"])
    eps = float(field(hf, "layer_norm_epsilon", 1e-5))
    ss = StateSpace(
        layers=tuple(range(layers)), num_heads=int(hf["num_heads"]), head_dim=int(hf["head_dim"]),
        state_size=int(hf["state_size"]), n_groups=int(field(hf, "n_groups", 8)),
        conv_kernel=int(field(hf, "conv_kernel", 4)), conv_bias=bool(field(hf, "use_conv_bias", True)),
        proj_bias=bool(field(hf, "use_bias", False)), norm_eps=eps, time_step_limit=time_step_limit(hf),
        residual_in_fp32=bool(field(hf, "residual_in_fp32", True)),
        chunk_size=int(field(hf, "chunk_size", 256)),
    )
    if ss.num_heads % ss.n_groups:
        raise ConfigError(f"num_heads ({ss.num_heads}) must be a multiple of n_groups ({ss.n_groups})")
    return ModelConfig(
        architecture=arch, vocab_size=int(hf["vocab_size"]), hidden_size=hidden, intermediate_size=ss.inner,
        num_layers=layers, num_heads=1, num_kv_heads=1, head_dim=2, rms_norm_eps=eps,
        max_position_embeddings=int(field(hf, "max_position_embeddings", 1 << 20)),
        tie_word_embeddings=bool(field(hf, "tie_word_embeddings", False)), state_space=ss,
        bos_token_id=hf.get("bos_token_id"), eos_token_ids=token_ids(hf.get("eos_token_id")),
    )


FAMILY = Family("mamba2", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=("backbone.embeddings.weight", "backbone.norm_f.weight"), required=REQUIRED)
