"""TII Falcon-H1 (`FalconH1ForCausalLM`): in every layer attention and a Mamba2 mixer read the same normed input
side by side, their outputs summed into the residual stream, then a gated MLP; muP multipliers throughout.

Each layer is Llama's (attention and the gated MLP, `llama.LayerWeights`) with a Mamba2 mixer's fields beside
the attention's, so each keeps K/V pages and a recurrent state (`StateSpace.parallel_attention`). The multipliers:
the embeddings' and logits' (`embedding_multiplier`, `logits_scaling` = 1 / lm_head_multiplier), the key's (a
factor on the softmax scale: q . (m k) = m (q . k)), in_proj's per part (`StateSpace.proj_multipliers` from
ssm_multipliers), and the sublayers' inputs and outputs (`ModelConfig.multipliers`). The mixer's gated RMSNorm is
optional (`mamba_rms_norm`; off: y * silu(z)) and normalises before the gate by default (mamba_norm_before_gate).
Tensor names are Bamba's (`input_layernorm`, `pre_ff_layernorm`, `feed_forward.*`, `mamba.*`,
`model.final_layernorm`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.cache.state_pool import read_state, write_state
from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.config.multipliers import SublayerMultipliers
from jaxinfer.models.bamba import hf_leaves
from jaxinfer.models.family import Family
from jaxinfer.models.granite import scaled
from jaxinfer.models.granite_moe_hybrid import state_space
from jaxinfer.models.hybrid import MambaDenseLayer
from jaxinfer.models.layers import linear, linears
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.llama import abstract_layer as llama_abstract_layer
from jaxinfer.models.mamba2 import check_activation
from jaxinfer.models.mamba2_mixer import MixerWeights, mixer, mixer_leaves
from jaxinfer.models.mlp import gate_product
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, self_attention

ARCHITECTURES = ("FalconH1ForCausalLM",)
HF_RMS_NORM_EPS, HF_D_SSM = 1e-5, 1024  # FalconH1Config's defaults


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ParallelHybridLayer(MambaDenseLayer):
    """Llama's layer with a Mamba2 mixer's fields beside its attention's (all set: both run in every layer)."""

    PROJECTIONS: ClassVar[dict[str, int]] = {**LayerWeights.PROJECTIONS, **MixerWeights.PROJECTIONS}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = LayerWeights.JOINED


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> ParallelHybridLayer:
    """One layer's leaves: Llama's and the mixer's."""
    dense = llama_abstract_layer(cfg, layer)
    kept = {f.name: getattr(dense, f.name) for f in dataclasses.fields(dense)}
    return ParallelHybridLayer(**kept, **mixer_leaves(cfg.state_space, cfg.hidden_size))


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: ParallelHybridLayer, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """The mixer and attention over one RMSNorm of x, summed, each scaled on its way in and out; then the gated
    MLP, its gate and output scaled."""
    m, layout, eps = cfg.multipliers, cache.layout, cfg.rms_norm_eps
    h = rms_norm(x, lw.attn_norm, eps)
    state = read_state(cache, layer, cfg, h.shape[0], h.shape[1])
    ssm, state = mixer(cfg.state_space, lw, scaled(h, m.ssm_in), positions, state)
    cache = write_state(cache, layer, state)
    attn, cache = self_attention(cfg, scaled(h, m.attention_in), cache, lw, layer, positions, rope.for_layer(layer))
    x = layout.constrain(x + (scaled(ssm, m.ssm_out) + scaled(attn, m.attention_out)), HIDDEN)
    g, u = linears(rms_norm(x, lw.mlp_norm, eps), [lw.w_gate, lw.w_up])
    mlp = linear(gate_product(cfg.activation, scaled(g, m.mlp_gate), u), lw.w_down)
    return layout.constrain(x + scaled(mlp, m.mlp_down), HIDDEN), cache


def multipliers(hf: Mapping[str, Any], arch: str) -> tuple[SublayerMultipliers, tuple[float, ...]]:
    """The sublayers' multipliers and in_proj's five (z, x, B, C, dt), checked."""
    mlp = [float(v) for v in field(hf, "mlp_multipliers", None) or (1.0, 1.0)]
    ssm = tuple(float(v) for v in field(hf, "ssm_multipliers", None) or (1.0,) * 5)
    if len(mlp) != 2 or len(ssm) != 5:
        raise ConfigError(f"mlp_multipliers {mlp} and ssm_multipliers {list(ssm)} must hold 2 (gate, down) and 5 "
                          f"(z, x, B, C, dt) values for {arch}")
    return SublayerMultipliers(
        attention_in=float(field(hf, "attention_in_multiplier", 1.0)),
        attention_out=float(field(hf, "attention_out_multiplier", 1.0)),
        ssm_in=float(field(hf, "ssm_in_multiplier", 1.0)), ssm_out=float(field(hf, "ssm_out_multiplier", 1.0)),
        mlp_gate=mlp[0], mlp_down=mlp[1],
    ), ssm


def mixer_gate(hf: Mapping[str, Any]) -> str:
    """How the mixer's output meets its gate (`StateSpace.gate`) by mamba_rms_norm and mamba_norm_before_gate."""
    if not field(hf, "mamba_rms_norm", False):
        return "gate"
    return "norm_then_gate" if field(hf, "mamba_norm_before_gate", True) else "norm_gated"


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Falcon-H1 HF config (FalconH1Config's defaults where a key is absent)."""
    check_activation(hf, "hidden_act", arch)
    if bool(field(hf, "mamba_proj_bias", False)) != bool(field(hf, "projectors_bias", False)):
        raise ConfigError(f"mamba_proj_bias and projectors_bias must be equal for {arch} (the mixer's in_proj and "
                          "out_proj biases are one setting here; released checkpoints set both false)")
    lm_head = float(field(hf, "lm_head_multiplier", 1.0))
    if lm_head == 0:
        raise ConfigError(f"lm_head_multiplier 0.0 is not supported for {arch}; give a nonzero multiplier")
    fields = common_fields({k: v for k, v in hf.items() if k not in ("layer_types", "layers_block_type")}, arch)
    layers, eps, hidden = fields["num_layers"], float(field(hf, "rms_norm_eps", HF_RMS_NORM_EPS)), fields["hidden_size"]
    sublayers, proj = multipliers(hf, arch)
    d_ssm = field(hf, "mamba_d_ssm", HF_D_SSM)
    inner = None if d_ssm is None else int(d_ssm)  # None: mamba_expand x hidden_size
    mamba = state_space({**hf, "rms_norm_eps": eps}, tuple(range(layers)), hidden, inner)
    bias = bool(field(hf, "attention_bias", False))
    return ModelConfig(
        **{**fields, "rms_norm_eps": eps,
           "max_position_embeddings": int(field(hf, "max_position_embeddings", 8192))},
        qkv_bias=bias,
        o_bias=bias,
        activation=activation_name(field(hf, "hidden_act", "silu")),
        embedding_multiplier=float(field(hf, "embedding_multiplier", 1.0)),
        logits_scaling=1.0 / lm_head,
        attn_scale=fields["head_dim"] ** -0.5 * float(field(hf, "key_multiplier", 1.0)),
        multipliers=sublayers,
        state_space=dataclasses.replace(mamba, gate=mixer_gate(hf), proj_multipliers=proj, parallel_attention=True),
    )


FAMILY = Family("falcon_h1", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=("model.embed_tokens.weight", "model.final_layernorm.weight"))
