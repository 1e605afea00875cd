"""Meituan LongCat-Flash (`LongcatFlashForCausalLM`): DeepSeek's latent attention in "shortcut-connected MoE"
layers, as transformers' modeling_longcat_flash has them.

Each of the checkpoint's `num_layers` layers runs two halves, each DeepSeek's dense layer (models/deepseek: RMSNorm,
latent attention with a low-rank query, RMSNorm, a SwiGLU of `ffn_hidden_size`) with its own attention cache; here
each half is a decoder layer (cfg.num_layers = 2 x num_layers, tensors `self_attn.{0,1}`, `mlps.{0,1}`,
`input_layernorm.{0,1}`, `post_attention_layernorm.{0,1}`: `layer_hf_leaves`). The first half's MLP input also
feeds the layer's MoE, whose output is added after the second half's MLP: the first half hands the second its
residual and that output stacked ([2, B, T, D], as Gemma 3n's AltUp hands on its streams), the second adds it back.

The MoE (`LongcatFlashMoE`) scores `n_routed_experts` + `zero_expert_num` experts by a float32 softmax of the
router's logits (`router.classifier`), chooses the top `moe_topk` of score +
`e_score_correction_bias` and weighs them by their scores times `routed_scaling_factor` (no renormalising); a
chosen zero-computation expert (id >= n_routed_experts, `cfg.zero_experts`) returns its input.
The latent attention scales the query by sqrt(hidden / q_lora_rank) and the normed latent by
sqrt(hidden / kv_lora_rank) (`LatentAttention.q_scale`, `latent_scale`); rope in adjacent pairs. `model.mtp.*`
is not read. Refused by name: a biased router (`router_bias`), a full-rank query (`q_lora_rank` null) and a
`qk_head_dim` other than qk_nope_head_dim + qk_rope_head_dim.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.models.deepseek import DeepseekLayerWeights, latent_fields
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.grouped_matmul import Experts
from jaxinfer.models.latent_attention import latent_attention, latent_attention_hf_leaves, latent_attention_leaves
from jaxinfer.models.layers import linear
from jaxinfer.models.mlp import gated_mlp, mlp_hf_leaves, mlp_leaves
from jaxinfer.models.moe import ROUTER_AXES, abstract_moe_layer, experts_hf_leaves, experts_output
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("LongcatFlashForCausalLM",)
# LongcatFlashConfig's defaults for the fields a config may leave out (or null).
HF_DEFAULTS = dict(max_position_embeddings=131072, rms_norm_eps=1e-5, ffn_hidden_size=12288, q_lora_rank=1536,
                   kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, moe_topk=12,
                   n_routed_experts=512, zero_expert_num=256, expert_ffn_hidden_size=2048, routed_scaling_factor=6.0,
                   router_bias=False, attention_bias=False, tie_word_embeddings=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0})
REQUIRED = ("vocab_size", "hidden_size", "num_layers", "num_attention_heads")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class ShortcutLayer(DeepseekLayerWeights):
    """A layer's first half: DeepSeek's dense layer, and the MoE reading its MLP's normed input."""

    router: jax.Array  # [D, E + Z] float32: router.classifier
    moe_gate: Experts  # [E, D, F]: the routed experts only (the zero experts have no weights)
    moe_up: Experts  # [E, D, F]
    moe_down: Experts  # [E, F, D]
    score_correction: jax.Array  # [E + Z] float32: e_score_correction_bias, added for choosing only

    EXPERTS: ClassVar[tuple[str, ...]] = ("moe_gate", "moe_up", "moe_down")


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> Any:
    """Half `layer % 2` of layer `layer // 2`: DeepSeek's dense layer, the first half with the MoE's leaves."""
    D, scored = cfg.hidden_size, cfg.num_experts + cfg.zero_experts
    dense = DeepseekLayerWeights(**latent_attention_leaves(cfg), **mlp_leaves(D, cfg.intermediate_size))
    if layer % 2:
        return dense
    routed = abstract_moe_layer(cfg)
    return ShortcutLayer(
        **{f.name: getattr(dense, f.name) for f in dataclasses.fields(dense)},
        **{name: getattr(routed, name) for name in ShortcutLayer.EXPERTS},
        router=ArrayInfo((D, scored), ROUTER_AXES, dtype="float32"),
        score_correction=ArrayInfo((scored,), (None,), init_value=0.0, dtype="float32"),
    )


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """None shared by every layer: each half names its own (`layer_hf_leaves`)."""
    return {}


def layer_hf_leaves(cfg: ModelConfig, layer: int) -> dict[str, HFLeaf]:
    """Where half `layer % 2` of checkpoint layer `layer // 2` keeps its tensors (and the first half the MoE's)."""
    D, F, half, scored = cfg.hidden_size, cfg.intermediate_size, layer % 2, cfg.num_experts + cfg.zero_experts
    p = f"model.layers.{layer // 2}."
    leaves = {
        **latent_attention_hf_leaves(cfg, f"{p}self_attn.{half}."),
        "attn_norm": HFLeaf(f"{p}input_layernorm.{half}.weight", "same", (D,)),
        "mlp_norm": HFLeaf(f"{p}post_attention_layernorm.{half}.weight", "same", (D,)),
        **mlp_hf_leaves(D, F, f"{p}mlps.{half}."),
    }
    if half:
        return leaves
    return {
        **leaves,
        "router": HFLeaf(f"{p}mlp.router.classifier.weight", "transpose", (scored, D)),
        "score_correction": HFLeaf(f"{p}mlp.router.e_score_correction_bias", "same", (scored,)),
        **experts_hf_leaves(cfg, f"{p}mlp.experts.", ("gate_proj", "up_proj", "down_proj")),
    }


def route(h2: jax.Array, lw: ShortcutLayer, cfg: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """Weights [N, k] (float32) and expert ids [N, k] (zero experts from num_experts on) of rows h2 [N, D]."""
    scores = jax.nn.softmax(linear(h2.astype(jnp.float32), lw.router), axis=-1)
    _, experts = jax.lax.top_k(scores + lw.score_correction, cfg.experts_per_token)
    return jnp.take_along_axis(scores, experts, axis=-1) * cfg.routed_scaling_factor, experts


def shortcut_moe(h: jax.Array, lw: ShortcutLayer, cfg: ModelConfig, layout: Layout) -> jax.Array:
    """The MoE's output for h [B, T, D]: the routed experts' mix (zero experts add nothing there) plus each row
    times the weights its zero experts got, in h's dtype."""
    h2 = h.reshape(-1, h.shape[-1])
    weights, experts = route(h2, lw, cfg)
    routed = experts_output(h2, weights, experts, lw, layout, cfg.activation)
    identity = jnp.sum(jnp.where(experts >= cfg.num_experts, weights, 0.0), axis=-1, keepdims=True)
    return (routed + h2.astype(jnp.float32) * identity).astype(h.dtype).reshape(h.shape)


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """One half: attention and the dense MLP, each added to the residual; the first half returns [residual, the
    MoE's output] stacked, the second takes them and adds the MoE's output at its end."""
    layout, eps = cache.layout, cfg.rms_norm_eps
    x, shortcut = (x, None) if isinstance(lw, ShortcutLayer) else (x[0], x[1])
    out, cache = latent_attention(cfg, rms_norm(x, lw.attn_norm, eps), cache, lw, layer, positions,
                                  rope.for_layer(layer))
    x = layout.constrain(x + out, HIDDEN)
    h = rms_norm(x, lw.mlp_norm, eps)
    x = x + gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation)
    if shortcut is not None:
        return layout.constrain(x + shortcut, HIDDEN), cache
    moe = layout.constrain(shortcut_moe(h, lw, cfg, layout), HIDDEN)
    return jnp.stack([layout.constrain(x, HIDDEN), moe]), cache


def check_supported(hf: Mapping[str, Any], arch: str) -> None:
    """Refuse by name what transformers' LongCat-Flash runs and this family does not."""
    if hf["router_bias"]:
        raise ConfigError(f"router_bias {hf['router_bias']!r} is not supported for {arch}; supported: false (the "
                          "released checkpoints' router has no bias)")
    if not int(hf["q_lora_rank"]):
        raise ConfigError(f"q_lora_rank {hf['q_lora_rank']!r} is not supported for {arch}: LongCat-Flash's query is "
                          "always low-rank (q_a_proj, its norm, q_b_proj)")
    head = int(hf["qk_nope_head_dim"]) + int(hf["qk_rope_head_dim"])
    if int(field(hf, "qk_head_dim", head)) != head:
        raise ConfigError(f"qk_head_dim {hf['qk_head_dim']!r} is not supported for {arch}: qk_nope_head_dim + "
                          f"qk_rope_head_dim ({head})")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a LongCat-Flash HF config (LongcatFlashConfig's defaults where a key is absent or null)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    check_supported(hf, arch)
    layers = int(hf["num_layers"])
    fields = common_fields({**hf, "num_hidden_layers": 2 * layers, "intermediate_size": hf["ffn_hidden_size"]}, arch)
    attention = latent_fields(hf, fields, interleaved=True)
    mla, D = attention["latent_attention"], fields["hidden_size"]
    scaled = dataclasses.replace(mla, q_scale=math.sqrt(D / mla.q_lora_rank),
                                 latent_scale=math.sqrt(D / mla.kv_lora_rank))
    zero = int(hf["zero_expert_num"])
    experts, per_token = int(hf["n_routed_experts"]), int(hf["moe_topk"])
    if experts < 1 or zero < 0 or not 0 < per_token <= experts + zero:
        raise ConfigError(f"n_routed_experts {experts}, zero_expert_num {zero} and moe_topk {per_token} are not "
                          f"supported for {arch}: at least one routed expert, and moe_topk of them all")
    return ModelConfig(
        **{**attention, "latent_attention": scaled},
        activation=activation_name(field(hf, "hidden_act", "silu")),
        num_experts=experts,
        zero_experts=zero,
        experts_per_token=per_token,
        moe_intermediate_size=int(hf["expert_ffn_hidden_size"]),
        routed_scaling_factor=float(hf["routed_scaling_factor"]),
    )


FAMILY = Family("longcat_flash", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                required=REQUIRED, layer_hf_leaves=layer_hf_leaves)
