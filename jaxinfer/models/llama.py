"""The Llama family: Llama 2/3, Mistral, Qwen2, Qwen3, Gemma (1) and SmolLM3, one pre-norm decoder layer.

The architectures differ only by config fields (biases, q/k norm, norm offset, embedding
scale, activation, sliding windows, SmolLM3's layers without rotary embeddings), read here;
the layer is attention then a gated MLP, each behind an RMSNorm and added to the residual stream.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax

from jaxinfer.config.model import (
    ConfigError,
    ModelConfig,
    activation_name,
    common_fields,
    layer_types,
    uniform_windows,
)
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import Weight
from jaxinfer.models.mlp import gated_mlp, mlp_hf_leaves, mlp_leaves
from jaxinfer.models.norms import config_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.self_attention import HIDDEN, attention_hf_leaves, attention_leaves, self_attention
from jaxinfer.parallel.array_info import ArrayInfo

SMOLLM3 = "SmolLM3ForCausalLM"
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "GemmaForCausalLM",
                 SMOLLM3)
QWEN_ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
HF_MAX_WINDOW_LAYERS = 28  # transformers' default for Qwen2/Qwen3


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LayerWeights:
    """Weights of one pre-norm decoder layer."""

    attn_norm: jax.Array | None  # [D]; None: OLMo 1's weightless LayerNorm
    wq: Weight  # [D, H, K]
    wk: Weight  # [D, KV, K]
    wv: Weight  # [D, KV, K]
    wo: Weight  # [H, K, D]
    mlp_norm: jax.Array | None  # [D]
    w_gate: Weight  # [D, F]
    w_up: Weight  # [D, F]
    w_down: Weight  # [F, D]
    bq: jax.Array | None = None  # [H, K]
    bk: jax.Array | None = None  # [KV, K]
    bv: jax.Array | None = None  # [KV, K]
    bo: jax.Array | None = None  # [D]
    q_norm: jax.Array | None = None  # [K]
    k_norm: jax.Array | None = None  # [K]

    # Projection fields and how many leading axes each contracts with the activations.
    PROJECTIONS: ClassVar[dict[str, int]] = {"wq": 1, "wk": 1, "wv": 1, "wo": 2, "w_gate": 1, "w_up": 1, "w_down": 1}
    # Projections that read the same activations: joined into the first field on one device (see joined_weight).
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("wq", "wk", "wv"), ("w_gate", "w_up"))


PROJECTIONS = LayerWeights.PROJECTIONS


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> LayerWeights:
    """One decoder layer's leaves as ArrayInfos."""
    norm = 0.0 if cfg.norm_weight_offset else 1.0
    D = cfg.hidden_size
    return LayerWeights(
        attn_norm=ArrayInfo((D,), ("embed",), init_value=norm),
        mlp_norm=ArrayInfo((D,), ("embed",), init_value=norm),
        **attention_leaves(cfg),
        **mlp_leaves(D, cfg.intermediate_size),
    )


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives in an HF checkpoint."""
    D = cfg.hidden_size
    return {
        "attn_norm": HFLeaf("model.layers.{i}.input_layernorm.weight", "same", (D,)),
        "mlp_norm": HFLeaf("model.layers.{i}.post_attention_layernorm.weight", "same", (D,)),
        **attention_hf_leaves(cfg),
        **mlp_hf_leaves(D, cfg.intermediate_size),
    }


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: LayerWeights, layer: int, positions: jax.Array, rope: RopeTables
) -> tuple[jax.Array, Any]:
    """One pre-norm block: attention over the cache (after writing this step's K/V), then MLP. The norms are the
    config's (`norms.config_norm`): RMSNorms, or OLMo 1's LayerNorms without a weight (attn_norm, mlp_norm None)."""
    layout = cache.layout
    h = config_norm(x, lw.attn_norm, None, cfg)
    out, cache = self_attention(cfg, h, cache, lw, layer, positions, rope.for_layer(layer))
    x = layout.constrain(x + out, HIDDEN)
    h = config_norm(x, lw.mlp_norm, None, cfg)
    return layout.constrain(x + gated_mlp(h, lw.w_gate, lw.w_up, lw.w_down, cfg.activation), HIDDEN), cache


def _qwen_windows(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """Qwen2/Qwen3 as transformers reads them: `layer_types`, else sliding from `max_window_layers` on.

    Either way a sliding layer slides only when `use_sliding_window` is set (transformers drops
    `sliding_window` otherwise, and the layer attends to everything).
    """
    window = int(hf.get("sliding_window") or 0) if hf.get("use_sliding_window") else 0
    types = layer_types(hf, num_layers)
    if types is None:
        start = int(hf.get("max_window_layers", HF_MAX_WINDOW_LAYERS))
        types = ["sliding_attention" if window and i >= start else "full_attention" for i in range(num_layers)]
    return tuple(window if t == "sliding_attention" else 0 for t in types)


def _smollm3_windows(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """SmolLM3: `sliding_window` on the layers `layer_types` marks sliding, only with `use_sliding_window`."""
    window = int(hf.get("sliding_window") or 0) if hf.get("use_sliding_window") else 0
    types = layer_types(hf, num_layers) or ["full_attention"] * num_layers
    return tuple(window if t == "sliding_attention" else 0 for t in types)


def nope_layers(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """SmolLM3's layers without rotary embeddings: zeros of `no_rope_layers`, by default every
    `no_rope_layer_interval`-th layer (transformers' default list)."""
    interval = int(hf.get("no_rope_layer_interval") or 4)
    uses = hf.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(num_layers)]
    if len(uses) != num_layers:
        raise ConfigError(f"no_rope_layers has {len(uses)} entries for {num_layers} layers; give one 0/1 per layer")
    return tuple(i for i, use in enumerate(uses) if not use)


def _layer_windows(hf: Mapping[str, Any], arch: str, num_layers: int) -> tuple[int, ...]:
    """Sliding-window size per layer (0 = full attention), checked against any `layer_types`."""
    if arch in QWEN_ARCHITECTURES:
        return _qwen_windows(hf, num_layers)
    if arch == SMOLLM3:
        return _smollm3_windows(hf, num_layers)
    layer_types(hf, num_layers)
    sliding = arch == "MistralForCausalLM" and bool(hf.get("sliding_window"))
    return uniform_windows(hf, arch, num_layers, int(hf["sliding_window"]) if sliding else 0)


def gemma_activation(hf: Mapping[str, Any]) -> str:
    """Gemma's activation: "gelu" means tanh there, as transformers has it (a legacy name).

    transformers 4 reads `hidden_activation` and 5 `hidden_act`; when a config sets both to
    different functions the two versions disagree, so it is rejected.
    """
    names = [hf[k] for k in ("hidden_activation", "hidden_act") if hf.get(k)] or ["gelu_pytorch_tanh"]
    chosen = {activation_name("gelu_pytorch_tanh" if n == "gelu" else n) for n in names}
    if len(chosen) > 1:
        raise ConfigError(
            f"Gemma hidden_activation {hf['hidden_activation']!r} and hidden_act {hf['hidden_act']!r} name "
            "different functions (transformers 4 reads the first, 5 the second); make them agree"
        )
    return chosen.pop()


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Llama-family HF config."""
    fields = common_fields(hf, arch)
    is_gemma = arch == "GemmaForCausalLM"
    # Qwen2 always biases q/k/v (not o); Mistral never has biases; the rest follow attention_bias.
    attention_bias = bool(hf.get("attention_bias", False)) and arch != "MistralForCausalLM"
    return ModelConfig(
        **{**fields, "tie_word_embeddings": bool(hf.get("tie_word_embeddings", is_gemma or arch == SMOLLM3))},
        qkv_bias=arch == "Qwen2ForCausalLM" or attention_bias,
        o_bias=attention_bias and arch != "Qwen2ForCausalLM",
        qk_norm=arch == "Qwen3ForCausalLM",
        activation=gemma_activation(hf) if is_gemma else activation_name(hf.get("hidden_act") or "silu"),
        norm_weight_offset=1.0 if is_gemma else 0.0,
        scale_embeddings=is_gemma,
        layer_windows=_layer_windows(hf, arch, fields["num_layers"]),
        nope_layers=nope_layers(hf, fields["num_layers"]) if arch == SMOLLM3 else (),
    )


FAMILY = Family("llama", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
