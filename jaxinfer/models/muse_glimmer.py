"""Muse Glimmer (text): MuseGlimmerForConditionalGeneration's language model run text-only.

transformers 5.24's MuseGlimmerTextModel is Gemma 2's sandwich layer (a norm before and after attention and the
MLP) with these changes read here:
- the layer's four norms scale by 1 + w (Gemma 2's "centered" RMSNorm), the output norms with their own epsilon
  (`post_norm_eps`, 1e-8: `cfg.post_norm_eps`); the final norm scales by w (Gemma 4's);
- the embeddings are RMS-normed without a weight (`cfg.embed_norm`), not scaled by sqrt(hidden_size);
- q and k are RMS-normed per head without a weight before the rotation (`cfg.qk_weightless_norm`), q times
  `qk_scale_factor` (folded into the attention scale); the output is gated by sigmoid(gate_proj(h)) per head and
  dim before o_proj (`attn_gate`, HRM-Text's);
- `layer_rope_theta` 0 marks a NoPE layer (by default every 4th from the last, which is also the full-attention
  one; the rest slide over `sliding_window`);
- the logits are times `output_multiplier`, then soft-capped at `final_logit_softcapping`.
The checkpoint is Kimi K2.5's layout (`model.language_model.*`, `lm_head.*`) beside the vision tower, adapter and
projection (`model.vision_tower.*`, `model.vision_adapter.*`, `model.vision_projection.*`), which are not run
(models/text_part): an image is refused by name.

Refused by name: per-layer thetas other than 0 or the global one, a rope type other than default, and a
`hidden_activation` other than the activations the MLP runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field, layer_types
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.gemma2 import SandwichLayerWeights
from jaxinfer.models.gemma2 import abstract_layer as gemma2_layer
from jaxinfer.models.gemma2 import hf_leaves as gemma2_hf_leaves
from jaxinfer.models.layers import Weight
from jaxinfer.models.mlp import gated_mlp
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, self_attention
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("MuseGlimmerForConditionalGeneration",)
# MuseGlimmerTextConfig's defaults for the fields a config may leave out (or null).
HF_DEFAULTS = dict(vocab_size=202_048, hidden_size=6656, intermediate_size=19968, num_hidden_layers=52,
                   num_attention_heads=32, num_key_value_heads=2, head_dim=128, max_position_embeddings=131_072,
                   rms_norm_eps=1e-5, bos_token_id=200_000, eos_token_id=200_001, sliding_window=2048,
                   final_logit_softcapping=20.0, qk_scale_factor=3.87, output_multiplier=0.19611613513818404,
                   post_norm_eps=1e-8)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class GatedSandwichLayer(SandwichLayerWeights):
    """Gemma 2's layer with the attention output gate."""

    attn_gate: Weight | None = None  # [D, H, K]

    PROJECTIONS: ClassVar[dict[str, int]] = {**SandwichLayerWeights.PROJECTIONS, "attn_gate": 1}


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> GatedSandwichLayer:
    """Gemma 2's leaves (norm weights stored as w - 1) and the gate."""
    base = gemma2_layer(cfg, layer)
    D, H, K = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    return GatedSandwichLayer(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                              attn_gate=ArrayInfo((D, H, K), ("embed", "q_heads", "head_dim")))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Gemma 2's names and the gate's."""
    D, H, K = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    return {**gemma2_hf_leaves(cfg),
            "attn_gate": HFLeaf("model.layers.{i}.self_attn.gate_proj.weight", "in_heads", (H * K, D), H, K)}


def sandwich(cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array,
             rope: RopeTables, mlp: Any) -> tuple[jax.Array, Any]:
    """Gemma 2's sandwich with 1 + w norms, the output norms with `cfg.post_norm_eps` (the final norm, outside the
    layers, scales by w: `cfg.norm_weight_offset` 0)."""
    layout: Layout = cache.layout
    eps, post_eps = cfg.rms_norm_eps, cfg.post_norm_eps or cfg.rms_norm_eps
    out, cache = self_attention(cfg, rms_norm(x, lw.attn_norm, eps, 1.0), cache, lw, layer, positions,
                                rope.for_layer(layer))
    x = layout.constrain(x + rms_norm(out, lw.post_attn_norm, post_eps, 1.0), HIDDEN)
    h = mlp(rms_norm(x, lw.mlp_norm, eps, 1.0), layout)
    return layout.constrain(x + rms_norm(h, lw.post_mlp_norm, post_eps, 1.0), HIDDEN), cache


def decoder_layer(cfg: ModelConfig, x, cache, lw, layer: int, positions, rope: RopeTables):
    """The sandwich around the gated attention and the dense MLP."""
    return sandwich(cfg, x, cache, lw, layer, positions, rope,
                    lambda h, layout: gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation))


def attention_fields(hf: Mapping[str, Any], arch: str, num_layers: int) -> dict[str, Any]:
    """Windows, NoPE layers and rope of a Muse text config whose defaults are filled in (Muse Spark's too)."""
    types = layer_types(hf, num_layers) or [
        "full_attention" if (num_layers - 1 - i) % 4 == 0 else "sliding_attention" for i in range(num_layers)]
    rope = hf.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise ConfigError(f"rope_parameters {rope!r} is not supported for {arch}: the default rope only")
    theta = float(rope.get("rope_theta", field(hf, "rope_theta", 10000.0)))
    thetas = field(hf, "layer_rope_theta", [0 if (num_layers - 1 - i) % 4 == 0 else theta for i in range(num_layers)])
    if len(thetas) != num_layers or any(t and float(t) != theta for t in thetas):
        raise ConfigError(f"layer_rope_theta {thetas!r} is not supported for {arch}: one entry per layer, each 0 (no "
                          f"rotary embeddings) or the rope_theta ({theta})")
    window = int(hf["sliding_window"])
    return dict(rope_theta=theta, layer_windows=tuple(window if t == "sliding_attention" else 0 for t in types),
                nope_layers=tuple(i for i, t in enumerate(thetas) if not t))


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Muse Glimmer text config (MuseGlimmerTextConfig's defaults where a key is absent or null)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    fields = common_fields({k: v for k, v in hf.items() if k not in ("rope_parameters", "rope_scaling")}, arch)
    attention = attention_fields(hf, arch, fields["num_layers"])
    return ModelConfig(
        **{**fields, "rope_theta": attention.pop("rope_theta")},
        **attention,
        activation=activation_name(hf.get("hidden_activation") or "silu"),
        embed_norm=True,
        qk_weightless_norm=True,
        attn_scale=float(hf["qk_scale_factor"]) * fields["head_dim"] ** -0.5,
        post_norm_eps=float(hf["post_norm_eps"]),
        norm_scale_first=True,
        logits_scaling=1.0 / float(hf["output_multiplier"]),
        final_soft_cap=float(hf["final_logit_softcapping"]),
    )


FAMILY = Family("muse_glimmer", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
