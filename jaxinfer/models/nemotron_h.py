"""NVIDIA Nemotron-H (`NemotronHForCausalLM`): one mixer per layer, by `hybrid_override_pattern` (transformers 5:
`layers_block_type`): "M" a Mamba2 mixer, "*" attention, "-" an ungated ReLU^2 MLP, each behind an RMSNorm and
added to the residual stream.

The attention layers have no rotary embeddings (NoPE) and no biases; the MLP layers keep neither K/V nor a state
(`cfg.mlp_only_layers`: their K/V buffers are empty, as a Mamba2 layer's are). Every tensor sits under
`backbone.layers.{i}.mixer.`, beside the layer's `norm`; embeddings and the final norm as Mamba2's. The MoE
layers ("E", Nemotron 3 Nano) are refused by name.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.config.generation import token_ids
from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, field
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import Weight
from jaxinfer.models.mamba2 import Mamba2Layer, check_activation, mamba_block
from jaxinfer.models.mamba2_mixer import mixer_hf_leaves, mixer_leaves
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, attention_hf_leaves, attention_leaves, self_attention
from jaxinfer.models.ungated_mlp import ungated_mlp
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("NemotronHForCausalLM",)
MIXER = "backbone.layers.{i}.mixer."
# transformers' names for the pattern's letters, and what each runs here
KINDS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
BLOCK_TYPES = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention", "full_attention": "attention",
               "mlp": "mlp", "moe": "moe"}
REQUIRED = ("vocab_size", "hidden_size", "num_attention_heads", "mamba_num_heads", "mamba_head_dim", "ssm_state_size")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class AttentionBlock:
    """An RMSNorm then attention (self_attention's optional fields None: no biases, no q/k norms)."""

    norm: jax.Array  # [D]
    wq: Weight  # [D, H, K]
    wk: Weight  # [D, KV, K]
    wv: Weight  # [D, KV, K]
    wo: Weight  # [H, K, D]
    bq: None = None
    bk: None = None
    bv: None = None
    bo: None = None
    q_norm: None = None
    k_norm: None = None

    PROJECTIONS: ClassVar[dict[str, int]] = {"wq": 1, "wk": 1, "wv": 1, "wo": 2}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("wq", "wk", "wv"),)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MLPBlock:
    """An RMSNorm then the ungated MLP (models/ungated_mlp; no biases)."""

    norm: jax.Array  # [D]
    w_up: Weight  # [D, F]
    w_down: Weight  # [F, D]
    b_up: None = None
    b_down: None = None

    PROJECTIONS: ClassVar[dict[str, int]] = {"w_up": 1, "w_down": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = ()


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> Any:
    """Layer `layer`'s leaves: a Mamba2 mixer's, attention's or the MLP's, each with its norm."""
    D = cfg.hidden_size
    norm = ArrayInfo((D,), ("embed",), init_value=1.0)
    if cfg.is_state_layer(layer):
        return Mamba2Layer(norm=norm, **mixer_leaves(cfg.state_space, D))
    if layer in cfg.mlp_only_layers:
        F = cfg.intermediate_size
        return MLPBlock(norm=norm, w_up=ArrayInfo((D, F), ("embed", "mlp")), w_down=ArrayInfo((F, D), ("mlp", "embed")))
    return AttentionBlock(norm=norm, **attention_leaves(cfg))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives (each layer reads its own kind's)."""
    D, F = cfg.hidden_size, cfg.intermediate_size
    return {
        "norm": HFLeaf("backbone.layers.{i}.norm.weight", "same", (D,)),
        **attention_hf_leaves(cfg, MIXER),
        "w_up": HFLeaf(MIXER + "up_proj.weight", "transpose", (F, D)),
        "w_down": HFLeaf(MIXER + "down_proj.weight", "transpose", (D, F)),
        **mixer_hf_leaves(cfg.state_space, D, MIXER),
    }


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: RopeTables
) -> tuple[jax.Array, Any]:
    """x plus the layer's mixer of RMSNorm(x), by the weights' kind (`layer` is 0 in a one-layer view)."""
    if isinstance(lw, Mamba2Layer):
        return mamba_block(cfg, x, cache, lw, lw.norm, layer, positions)
    h = rms_norm(x, lw.norm, cfg.rms_norm_eps)
    if isinstance(lw, MLPBlock):
        out = ungated_mlp(h, lw, cfg.activation)
    else:
        out, cache = self_attention(cfg, h, cache, lw, layer, positions, rope.for_layer(layer))
    return cache.layout.constrain(x + out, HIDDEN), cache


def layer_kinds(hf: Mapping[str, Any], arch: str) -> list[str]:
    """Each layer's kind from `layers_block_type`, else `hybrid_override_pattern`; MoE layers refused by name."""
    types, pattern = field(hf, "layers_block_type"), field(hf, "hybrid_override_pattern")
    if types is None and pattern is None:
        raise ConfigError(f"{arch} configs set hybrid_override_pattern (or layers_block_type); this one sets neither")
    names = [BLOCK_TYPES.get(t) for t in types] if types is not None else [KINDS.get(c) for c in pattern]
    if None in names:
        raise ConfigError(f"layer kinds {types or pattern!r} are not supported for {arch}; supported: the pattern's "
                          f"M, *, - (layers_block_type {sorted(set(BLOCK_TYPES) - {'moe'})})")
    if "moe" in names:
        raise ConfigError(f"MoE layers ('E' / 'moe') are not supported for {arch}; supported: M (Mamba2), "
                          "* (attention) and - (MLP) layers")
    return names


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Nemotron-H HF config (NemotronHConfig's defaults where a key is absent)."""
    check_activation(hf, "mamba_hidden_act", arch)
    if field(hf, "residual_in_fp32", False) or field(hf, "mlp_bias", False) or field(hf, "attention_bias", False):
        raise ConfigError(f"residual_in_fp32, mlp_bias and attention_bias are not supported for {arch} (its "
                          "blocks keep the residual in the model's dtype, without biases); leave them false")
    kinds = layer_kinds(hf, arch)
    hidden, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    eps = float(field(hf, "layer_norm_epsilon", 1e-5))
    ss = StateSpace(
        layers=tuple(i for i, k in enumerate(kinds) if k == "mamba"), num_heads=int(hf["mamba_num_heads"]),
        head_dim=int(hf["mamba_head_dim"]), state_size=int(hf["ssm_state_size"]),
        n_groups=int(field(hf, "n_groups", 8)), conv_kernel=int(field(hf, "conv_kernel", 4)),
        conv_bias=bool(field(hf, "use_conv_bias", True)),
        proj_bias=bool(field(hf, "mamba_proj_bias", False)), norm_eps=eps,
        # transformers' Nemotron-H mixer clamps dt to (time_step_min, inf), whatever time_step_limit says
        time_step_limit=(float(field(hf, "time_step_min", 0.001)), math.inf),
        chunk_size=int(field(hf, "chunk_size", 128)),
    )
    if ss.num_heads % ss.n_groups:
        raise ConfigError(f"mamba_num_heads ({ss.num_heads}) must be a multiple of n_groups ({ss.n_groups})")
    return ModelConfig(
        architecture=arch, vocab_size=int(hf["vocab_size"]), hidden_size=hidden,
        intermediate_size=int(field(hf, "intermediate_size", 21504)), num_layers=len(kinds), num_heads=heads,
        num_kv_heads=int(field(hf, "num_key_value_heads", heads)), head_dim=int(field(hf, "head_dim", hidden // heads)),
        rms_norm_eps=eps, max_position_embeddings=int(field(hf, "max_position_embeddings", 4096)),
        tie_word_embeddings=bool(field(hf, "tie_word_embeddings", False)),
        activation=activation_name(field(hf, "mlp_hidden_act", "relu2")),
        nope_layers=tuple(range(len(kinds))), state_space=ss,
        mlp_only_layers=tuple(i for i, k in enumerate(kinds) if k == "mlp"),
        bos_token_id=hf.get("bos_token_id"), eos_token_ids=token_ids(hf.get("eos_token_id")),
    )


FAMILY = Family("nemotron_h", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=("backbone.embeddings.weight", "backbone.norm_f.weight"), required=REQUIRED)
