"""Ant Ling hybrid (`BailingHybridForCausalLM`, inclusionAI's Ling-3.0): Kimi Linear's layers (models/kimi_linear) with
two changes to each mixer, under Ant's tensor names.

As transformers' modeling_bailing_hybrid has it:

- By `layer_types` (by default the last of every `layer_group_size`, 6, attends) a KDA layer or DeepSeek-V3's latent
  attention, each before the dense MLP (`mlp_layer_types`, by default the first `first_k_dense_replace`) or V3's
  grouped sigmoid routing with shared experts.
- KDA's forget and output gates are one full-rank projection each (f_proj, g_proj: `kimi_delta.ONE_PROJECTION`);
  under `kda_safe_gate` (the default) the log decay is kda_lower_bound * sigmoid(exp(A_log) (f + dt_bias))
  (`StateSpace.decay_lower_bound`), else Kimi's softplus form.
- The latent attention is rotated (theta 6e6 by default; adjacent pairs, as DeepSeek-V3's interleaved rope) and
  each head's output is scaled by sigmoid(g_proj(x)) before o_proj (`LatentAttentionLayer.head_gate`).
- The checkpoints keep Ant's names: `model.word_embeddings`, every mixer under `attention.` with o_proj as `dense`,
  the router's correction bias as `gate.expert_bias`, each input's conv apart; the multi-token-prediction layers past
  num_hidden_layers are not read (transformers ignores them too).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.models.deepseek import DeepseekMoELayerWeights, grouped_fields, latent_fields
from jaxinfer.models.deepseek import abstract_layer as deepseek_abstract_layer
from jaxinfer.models.deepseek import hf_leaves as deepseek_hf_leaves
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.kimi_delta import ONE_PROJECTION, kda_hf_leaves, kda_state, one_projection_leaves
from jaxinfer.models.kimi_linear import LATENT_FIELDS, MLP_LAYER_TYPES, KdaDenseLayer, KdaMoELayer, _listed
from jaxinfer.models.kimi_linear import decoder_layer as kimi_linear_decoder_layer
from jaxinfer.models.layers import Weight
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("BailingHybridForCausalLM",)
LAYER_TYPES = ("linear_attention", "full_attention")
# Ant's config keys -> DeepSeek-V3's (BailingHybridConfig.attribute_map, reversed)
ANT_NAMES = {"num_experts": "n_routed_experts", "num_local_experts": "n_routed_experts",
             "num_experts_per_token": "num_experts_per_tok", "num_expert_group": "n_group",
             "num_shared_experts": "n_shared_experts", "moe_renormalize": "norm_topk_prob",
             "model_max_length": "max_position_embeddings"}
# BailingHybridConfig's defaults (DeepSeek-V3's names) for the keys a config may leave out
HF_DEFAULTS = dict(n_routed_experts=512, num_experts_per_tok=8, n_group=8, topk_group=4, n_shared_experts=1,
                   norm_topk_prob=True, routed_scaling_factor=2.5, moe_intermediate_size=768, kv_lora_rank=512,
                   q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                   max_position_embeddings=262144, rms_norm_eps=1e-6, head_dim=128, short_conv_kernel_size=4,
                   layer_group_size=6, first_k_dense_replace=2, rope_theta=6_000_000.0)


@dataclasses.dataclass(kw_only=True)
class OneProjectionFields:
    """The Ling hybrid's KDA gates (None by default only because the parents' defaults come first)."""

    f_proj: Weight | None = None  # [D, H K]
    g_proj: Weight | None = None  # [D, H K]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class OneProjectionDenseLayer(OneProjectionFields, KdaDenseLayer):
    """A KDA layer (one-projection gates) with the dense MLP."""

    PROJECTIONS: ClassVar[dict[str, int]] = {**KdaDenseLayer.PROJECTIONS, "f_proj": 1, "g_proj": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (ONE_PROJECTION, ("w_gate", "w_up"))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class OneProjectionMoELayer(OneProjectionFields, KdaMoELayer):
    """A KDA layer (one-projection gates) with routed and shared experts."""

    PROJECTIONS: ClassVar[dict[str, int]] = {**KdaMoELayer.PROJECTIONS, "f_proj": 1, "g_proj": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (ONE_PROJECTION, ("shared_gate", "shared_up"))


def abstract_layer(cfg: ModelConfig, layer: int) -> Any:
    """Layer `layer`'s leaves: DeepSeek-V3's with the per-head output gate, KDA's in place of latent attention on
    state layers."""
    base = deepseek_abstract_layer(cfg, layer, correction=True)
    if not cfg.is_state_layer(layer):
        return dataclasses.replace(base, head_gate=ArrayInfo((cfg.hidden_size, cfg.num_heads), ("embed", None)))
    kept = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.name not in LATENT_FIELDS}
    kind = OneProjectionMoELayer if isinstance(base, DeepseekMoELayerWeights) else OneProjectionDenseLayer
    return kind(**kept, **dict.fromkeys(LATENT_FIELDS), **one_projection_leaves(cfg.state_space, cfg.hidden_size))


def _ant_name(name: str) -> str:
    """A transformers module name as Ant's checkpoints store it."""
    for module, stored in ((".self_attn.o_proj.", ".attention.dense."), (".self_attn.", ".attention."),
                           (".gate.e_score_correction_bias", ".gate.expert_bias")):
        name = name.replace(module, stored)
    return name


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """DeepSeek-V3's names with the head gate, and KDA's with its one-projection gates, under Ant's names."""
    ss, D, prefix = cfg.state_space, cfg.hidden_size, "model.layers.{i}.self_attn."
    kda = {k: v for k, v in kda_hf_leaves(ss, D, prefix).items() if k not in ("f_a", "f_b", "g_a", "g_b")}
    leaves = {
        **deepseek_hf_leaves(cfg, correction=True),
        **kda,
        "a_log": HFLeaf(prefix + "A_log", "same", (ss.num_heads,)),
        "f_proj": HFLeaf(prefix + "f_proj.weight", "transpose", (ss.inner, D)),
        "g_proj": HFLeaf(prefix + "g_proj.weight", "transpose", (ss.inner, D)),
        "head_gate": HFLeaf(prefix + "g_proj.weight", "transpose", (cfg.num_heads, D)),
    }
    return {key: dataclasses.replace(leaf, name=_ant_name(leaf.name)) for key, leaf in leaves.items()}


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Ling hybrid HF config (Ant's or DeepSeek's key names; BailingHybridConfig's defaults)."""
    act = field(hf, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"hidden_act {act!r} is not supported for {arch} (its KDA conv and MLPs run SiLU); "
                          "supported: 'silu'")
    hf = {**HF_DEFAULTS, **{ANT_NAMES.get(k, k): v for k, v in hf.items() if v is not None or k == "q_lora_rank"}}
    # transformers saves head_dim overwritten by qk_rope_head_dim, the KDA dims as linear_*: those first
    heads = int(hf.get("linear_num_heads", hf["num_attention_heads"]))
    head_dim = int(hf.get("linear_head_dim", hf["head_dim"]))
    fields = common_fields({k: v for k, v in hf.items() if k != "head_dim"}, arch)
    layers = fields["num_layers"]
    group = int(hf["layer_group_size"])
    if group < 1:
        raise ConfigError(f"layer_group_size {group} must be >= 1 for {arch}")
    types = _listed(hf, "layer_types", ["full_attention" if (i + 1) % group == 0 else "linear_attention"
                                        for i in range(layers)], LAYER_TYPES, layers)
    first_k = int(hf["first_k_dense_replace"])
    mlp_types = _listed(hf, "mlp_layer_types", ["dense" if i < first_k else "sparse" for i in range(layers)],
                        MLP_LAYER_TYPES, layers)
    kernel = int(hf.get("linear_conv_kernel_dim", hf["short_conv_kernel_size"]))
    state = kda_state(tuple(i for i, t in enumerate(types) if t == "linear_attention"), heads=heads,
                      head_dim=head_dim, conv_kernel=kernel, eps=fields["rms_norm_eps"])
    bound = float(hf.get("kda_lower_bound", -5.0)) if hf.get("kda_safe_gate", True) else 0.0
    if hf.get("kda_safe_gate", True) and bound >= 0:
        raise ConfigError(f"kda_lower_bound {bound} is not supported for {arch} under kda_safe_gate: the log decay's "
                          "lower bound must be < 0")
    moe = moe_fields(hf, "n_routed_experts", int(hf["moe_intermediate_size"]))
    return ModelConfig(
        **latent_fields(hf, fields, interleaved=True),
        activation=activation_name("silu"),
        dense_layers=tuple(i for i, t in enumerate(mlp_types) if t == "dense"),
        state_space=dataclasses.replace(state, decay_lower_bound=bound),
        **grouped_fields(hf, arch, moe),
        **moe,
    )


FAMILY = Family("bailing_hybrid", ARCHITECTURES, read_config, abstract_layer, hf_leaves,
                kimi_linear_decoder_layer, top_names=("model.word_embeddings.weight", "model.norm.weight"))
