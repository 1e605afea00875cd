"""OLMo Hybrid (`OlmoHybridForCausalLM`, AllenAI's Olmo-Hybrid-7B): Gated DeltaNet layers beside OLMo 3's attention
layers, by `layer_types` (by default every fourth layer attends).

As transformers' modeling_olmo_hybrid has it:

- A "linear_attention" layer is Llama's pre-norm layer (norms scaled before the cast, as OLMo's are) whose attention
  is Qwen3-Next's Gated DeltaNet (models/gated_deltanet) with its six input projections each stored apart (q_proj,
  k_proj, v_proj, the gate g_proj, b_proj, a_proj), its conv stored per input (q_conv1d, k_conv1d, v_conv1d: one
  conv over q, k and v joined), beta doubled where `linear_allow_neg_eigval` (the default) says, and its gated norm
  `o_norm` at FLA's epsilon 1e-5 whatever rms_norm_eps is. The conv runs `hidden_act`: SiLU only, as the DeltaNet's.
- A "full_attention" layer is OLMo 3's (models/olmo2): q/k norms over all heads, each sublayer's output normed before
  its residual add; rotated where `rope_parameters` gives a rope_theta, else NoPE (the released checkpoints').
- The checkpoints name the DeltaNet layers' two norms `attention_layer_norm` / `feedforward_layer_norm` and an
  attention layer's post-attention norm `feedforward_layer_norm` (transformers renames them at load);
  `stored_names` reads its module names too.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar, Collection, Mapping

import jax

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.gated_deltanet import APART_PROJECTIONS, deltanet_hf_leaves, deltanet_leaves, deltanet_state
from jaxinfer.models.hybrid import ATTENTION_FIELDS, dense_hybrid_layer
from jaxinfer.models.layers import Weight
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.llama import abstract_layer as llama_abstract_layer
from jaxinfer.models.mlp import mlp_hf_leaves
from jaxinfer.models.olmo2 import abstract_layer as olmo2_abstract_layer
from jaxinfer.models.olmo2 import decoder_layer as olmo2_decoder_layer
from jaxinfer.models.olmo2 import hf_leaves as olmo2_hf_leaves
from jaxinfer.models.rope import RopeTables
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("OlmoHybridForCausalLM",)
LAYER_TYPES = ("linear_attention", "full_attention")
DELTANET = "model.layers.{i}.linear_attn."
INPUTS = ("q", "k", "v")  # the conv's inputs, in its channel order
GATE_NORM_EPS = 1e-5  # FLA's FusedRMSNormGated default, which transformers' o_norm keeps
# transformers' module names for the checkpoints' norms (its conversion_mapping renames them at load)
CHECKPOINT_NAMES = {"input_layernorm": "attention_layer_norm", "post_attention_layernorm": "feedforward_layer_norm"}
MODULE_NORM = re.compile(r"\.(input_layernorm|post_attention_layernorm)\.weight$")


@dataclasses.dataclass
class ApartDeltaNetFields:
    """The Gated DeltaNet's fields with every input projection and each conv input apart, added after Llama's
    fields; None by default only because the parent's fields have defaults."""

    in_q: Weight | None = None  # [D, key_heads * key_dim]
    in_k: Weight | None = None  # [D, key_heads * key_dim]
    in_v: Weight | None = None  # [D, value_heads * value_dim]
    in_z: Weight | None = None  # [D, value_heads * value_dim]
    in_b: Weight | None = None  # [D, value_heads]
    in_a: Weight | None = None  # [D, value_heads]
    conv_q: jax.Array | None = None  # [key_heads * key_dim, 1, K]
    conv_k: jax.Array | None = None  # [key_heads * key_dim, 1, K]
    conv_v: jax.Array | None = None  # [value_heads * value_dim, 1, K]
    dt_bias: jax.Array | None = None  # [H]
    a_log: jax.Array | None = None  # [H]
    gate_norm: jax.Array | None = None  # [value_dim]
    out_proj: Weight | None = None  # [value_heads * value_dim, D]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DeltaNetLayer(ApartDeltaNetFields, LayerWeights):
    """A DeltaNet layer: Llama's norms and gated MLP, attention's fields None, the mixer's added."""

    PROJECTIONS: ClassVar[dict[str, int]] = {
        **{k: v for k, v in LayerWeights.PROJECTIONS.items() if k not in ATTENTION_FIELDS},
        **{name: 1 for name in (*APART_PROJECTIONS, "out_proj")},
    }
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (APART_PROJECTIONS, ("w_gate", "w_up"))


def apart_leaves(cfg: ModelConfig) -> dict[str, ArrayInfo]:
    """The split DeltaNet's leaves (gated_deltanet) with in_qkv and the conv cut into q's, k's and v's."""
    ss, leaves = cfg.state_space, deltanet_leaves(cfg.state_space, cfg.hidden_size, split=True)
    qkv, conv = leaves.pop("in_qkv"), leaves.pop("conv_weight")
    widths = dict(zip(INPUTS, (ss.n_groups * ss.state_size, ss.n_groups * ss.state_size, ss.inner)))
    return dict(**{f"in_{x}": dataclasses.replace(qkv, shape=(cfg.hidden_size, n)) for x, n in widths.items()},
                **{f"conv_{x}": dataclasses.replace(conv, shape=(n, 1, ss.conv_kernel)) for x, n in widths.items()},
                **leaves)


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> Any:
    """Layer `layer`'s leaves: OLMo 3's post-norm attention layer, or Llama's norms and MLP around the DeltaNet."""
    if not cfg.is_state_layer(layer):
        return olmo2_abstract_layer(cfg, layer)
    dense = llama_abstract_layer(cfg, layer)
    kept = {f.name: None if f.name in ATTENTION_FIELDS else getattr(dense, f.name) for f in dataclasses.fields(dense)}
    return DeltaNetLayer(**kept, **apart_leaves(cfg))


def deltanet_layer_hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """A DeltaNet layer's tensors: its two norms, the MLP's and the mixer's, each projection and conv input apart."""
    ss, D, layer = cfg.state_space, cfg.hidden_size, "model.layers.{i}."
    key, value, H = ss.n_groups * ss.state_size, ss.inner, ss.num_heads
    projections = dict(in_q=("q", key), in_k=("k", key), in_v=("v", value), in_z=("g", value), in_b=("b", H),
                       in_a=("a", H))
    split = deltanet_hf_leaves(ss, D, DELTANET, split=True)
    return {
        **{leaf: HFLeaf(f"{DELTANET}{name}_proj.weight", "transpose", (width, D))
           for leaf, (name, width) in projections.items()},
        **{f"conv_{x}": HFLeaf(f"{DELTANET}{x}_conv1d.weight", "same", (projections[f"in_{x}"][1], 1, ss.conv_kernel))
           for x in INPUTS},
        "dt_bias": split["dt_bias"],
        "a_log": split["a_log"],
        "gate_norm": HFLeaf(DELTANET + "o_norm.weight", "same", (ss.head_dim,)),
        "out_proj": HFLeaf(DELTANET + "o_proj.weight", "transpose", (D, value)),
        "attn_norm": HFLeaf(layer + "attention_layer_norm.weight", "same", (D,)),
        "mlp_norm": HFLeaf(layer + "feedforward_layer_norm.weight", "same", (D,)),
        **mlp_hf_leaves(D, cfg.intermediate_size),
    }


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Every field's tensor: OLMo 3's layer's (its post-attention norm under the checkpoints' name) and the DeltaNet
    layer's."""
    attention = olmo2_hf_leaves(cfg)
    attention["post_attn_norm"] = HFLeaf("model.layers.{i}.feedforward_layer_norm.weight", "same", (cfg.hidden_size,))
    return {**attention, **deltanet_layer_hf_leaves(cfg)}


def stored_names(names: Collection[str]) -> dict[str, str]:
    """The checkpoints' norm names -> the stored ones, where a checkpoint keeps transformers' module names."""
    return {MODULE_NORM.sub(lambda m: f".{CHECKPOINT_NAMES[m[1]]}.weight", name): name
            for name in names if MODULE_NORM.search(name)}


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """OLMo 3's post-norm layer on an attention layer; the pre-norm hybrid layer on a DeltaNet layer."""
    if getattr(lw, "in_q", None) is None:
        return olmo2_decoder_layer(cfg, x, cache, lw, layer, positions, rope)
    return dense_hybrid_layer(cfg, x, cache, lw, layer, positions, rope)


def linear_layers(hf: Mapping[str, Any], num_layers: int, arch: str) -> tuple[int, ...]:
    """The layers `layer_types` marks linear_attention; without it, all but every fourth (and the last)."""
    default = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(num_layers)]
    if "full_attention" not in default:
        default[-1] = "full_attention"
    kinds = hf.get("layer_types") or default
    if len(kinds) != num_layers or not set(kinds) <= set(LAYER_TYPES):
        raise ConfigError(f"layer_types {kinds!r} must give one of {list(LAYER_TYPES)} for each of the {num_layers} "
                          f"layers of {arch}")
    return tuple(i for i, kind in enumerate(kinds) if kind == "linear_attention")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an OLMo Hybrid HF config (OlmoHybridConfig's defaults where a key is absent or null)."""
    act = field(hf, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"hidden_act {act!r} is not supported for {arch} (its DeltaNet conv runs it); "
                          "supported: 'silu'")
    hf = {key: value for key, value in hf.items() if key != "head_dim"}  # transformers drops it: hidden / heads
    fields = common_fields(hf, arch)
    heads, layers = fields["num_heads"], fields["num_layers"]
    key_heads = int(field(hf, "linear_num_key_heads", heads))
    key_dim = int(field(hf, "linear_key_head_dim", int(0.75 * fields["hidden_size"] / key_heads)))
    state = deltanet_state(linear_layers(hf, layers, arch), key_heads, key_dim,
                           int(field(hf, "linear_num_value_heads", heads)),
                           int(field(hf, "linear_value_head_dim", 2 * key_dim)),
                           int(field(hf, "linear_conv_kernel_dim", 4)), GATE_NORM_EPS)
    beta_scale = 2.0 if field(hf, "linear_allow_neg_eigval", True) else 1.0
    rotated = (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta")) is not None
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        **fields,
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        qk_norm_whole=True,
        norm_scale_first=True,
        activation=activation_name(act),
        state_space=dataclasses.replace(state, beta_scale=beta_scale),
        nope_layers=() if rotated else tuple(range(layers)),
    )


FAMILY = Family("olmo_hybrid", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                stored_names=stored_names)
