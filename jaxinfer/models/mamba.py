"""Mamba (`MambaForCausalLM`, state-spaces/mamba-*-hf) and FalconMamba (`FalconMambaForCausalLM`): every layer an
RMSNorm then Mamba-1's selective mixer (models/mamba1_mixer), added to the residual stream; FalconMamba's mixer
RMS-norms its dt, B and C (weightless, `mixer_rms_eps`).

The layer is Mamba2's (`mamba2.mamba_block`: the residual stream float32 with `residual_in_fp32`, the engine's one
state per request and no K/V) with the other mixer; the checkpoints keep the decoder under `backbone.` as Mamba2's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax

from jaxinfer.config.generation import token_ids
from jaxinfer.config.model import ConfigError, ModelConfig, field
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.mamba1_mixer import SelectiveWeights, selective_hf_leaves, selective_leaves, selective_mixer
from jaxinfer.models.mamba2 import check_activation, mamba_block
from jaxinfer.models.rope import RopeTables
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("MambaForCausalLM", "FalconMambaForCausalLM")
REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers")
FALCON_MAMBA_RMS_EPS = 1e-6  # FalconMambaConfig's mixer_rms_eps


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MambaLayer(SelectiveWeights):
    """A mixer's weights and the RMSNorm before it (always set: the default only follows the mixer's)."""

    norm: jax.Array | None = None  # [D]


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> MambaLayer:
    """One layer's leaves as ArrayInfos."""
    D = cfg.hidden_size
    return MambaLayer(norm=ArrayInfo((D,), ("embed",), init_value=1.0), **selective_leaves(cfg.state_space, D))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives in an HF checkpoint."""
    D = cfg.hidden_size
    return {
        "norm": HFLeaf("backbone.layers.{i}.norm.weight", "same", (D,)),
        **selective_hf_leaves(cfg.state_space, D, "backbone.layers.{i}.mixer."),
    }


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: MambaLayer, layer: int, positions: jax.Array, rope: RopeTables
) -> tuple[jax.Array, Any]:
    """RMSNorm, the selective mixer, the residual add."""
    return mamba_block(cfg, x, cache, lw, lw.norm, layer, positions, selective_mixer)


def time_step_rank(value: Any, hidden: int) -> int:
    """The dt rank: "auto" (transformers' default) is ceil(hidden_size / 16)."""
    if value in (None, "auto"):
        return math.ceil(hidden / 16)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"time_step_rank {value!r} is not supported: give a positive int or 'auto'")
    return value


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Mamba or FalconMamba HF config (the attention fields are placeholders: no layer attends)."""
    check_activation(hf, "hidden_act", arch)
    layers, hidden = int(hf["num_hidden_layers"]), int(hf["hidden_size"])
    inner = int(field(hf, "expand", 2) * hidden)  # transformers derives intermediate_size so, over a stored one
    eps = float(field(hf, "layer_norm_epsilon", 1e-5))
    falcon = arch == "FalconMambaForCausalLM"
    ss = dataclasses.replace(
        StateSpace.selective(
            tuple(range(layers)), inner, int(field(hf, "state_size", 16)), int(field(hf, "conv_kernel", 4)),
            time_step_rank(hf.get("time_step_rank"), hidden), bool(field(hf, "use_conv_bias", True)),
            bool(field(hf, "use_bias", False)),
            float(field(hf, "mixer_rms_eps", FALCON_MAMBA_RMS_EPS)) if falcon else None),
        residual_in_fp32=bool(field(hf, "residual_in_fp32", True)),
    )
    return ModelConfig(
        architecture=arch, vocab_size=int(hf["vocab_size"]), hidden_size=hidden, intermediate_size=inner,
        num_layers=layers, num_heads=1, num_kv_heads=1, head_dim=2, rms_norm_eps=eps,
        max_position_embeddings=int(field(hf, "max_position_embeddings", 1 << 20)),
        tie_word_embeddings=bool(field(hf, "tie_word_embeddings", True)), state_space=ss,
        bos_token_id=hf.get("bos_token_id"), eos_token_ids=token_ids(hf.get("eos_token_id")),
    )


FAMILY = Family("mamba", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=("backbone.embeddings.weight", "backbone.norm_f.weight"), required=REQUIRED)
