"""NAVER HyperCLOVA X SEED Think (HyperCLOVAXForCausalLM): Granite's layer with a norm after each sublayer.

Granite's four multipliers (`granite`), but for two: the logits are multiplied by `logits_scaling`
(Granite divides by it), and `attention_multiplier` defaults to head_dim ** -0.5 (Granite's to 1.0).
With `use_post_norm` (on by default) each sublayer's output is RMS-normed (`post_norm1`, `post_norm2`:
Peri-LN) before it is scaled and added to the residual stream. Heads are `head_dim` wide
(hidden_size / heads unless set); the other weights and their names are Llama's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax

from jaxinfer.config.model import ModelConfig, common_fields, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.granite import decoder_layer, granite_fields
from jaxinfer.models.llama import LayerWeights
from jaxinfer.models.llama import abstract_layer as llama_layer
from jaxinfer.models.llama import hf_leaves as llama_hf_leaves
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("HyperCLOVAXForCausalLM",)
DEFAULTS = dict(bos_token_id=1, eos_token_id=2)  # HyperCLOVAXConfig's (Granite's) where a config leaves them out


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PeriNormLayerWeights(LayerWeights):
    """The Llama layer with a norm of each sublayer's output (None without `use_post_norm`)."""

    post_attn_norm: jax.Array | None = None  # [D]
    post_mlp_norm: jax.Array | None = None  # [D]


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> PeriNormLayerWeights:
    """Llama's leaves and, with post norms (`cfg.output_norms`), the two output norms."""
    base = llama_layer(cfg, layer)
    norm = ArrayInfo((cfg.hidden_size,), ("embed",), init_value=1.0) if cfg.output_norms else None
    return PeriNormLayerWeights(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                                post_attn_norm=norm, post_mlp_norm=norm)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Llama's names and the output norms' (`post_norm1`, `post_norm2`)."""
    D, layer = cfg.hidden_size, "model.layers.{i}."
    return {**llama_hf_leaves(cfg), "post_attn_norm": HFLeaf(layer + "post_norm1.weight", "same", (D,)),
            "post_mlp_norm": HFLeaf(layer + "post_norm2.weight", "same", (D,))}


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a HyperCLOVA X HF config."""
    hf = {**DEFAULTS, **hf}
    head_dim = common_fields(hf, arch)["head_dim"]
    hf = {**hf, "attention_multiplier": field(hf, "attention_multiplier", head_dim ** -0.5)}
    fields = granite_fields(hf, arch)
    return ModelConfig(**{**fields, "logits_scaling": 1.0 / fields["logits_scaling"]},  # a multiplier here
                       output_norms=bool(field(hf, "use_post_norm", True)))


FAMILY = Family("hyperclovax", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer)
