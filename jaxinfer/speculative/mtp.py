"""Multi-token-prediction (MTP) layers as a draft head: DeepSeek-V3's, GLM-4.5's, GLM-4.7-Flash's.

At position i the layer reads the target's final hidden state h_i (before the final norm) and the
embedding of t_{i+1}: x = eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)]), then one decoder layer of
the target's own kind (its family's layer function: GQA + MoE for GLM-4.5, latent attention + MoE
for DeepSeek-V3 and GLM-4.7-Flash), whose output is the next step's h; shared_head.norm and shared_head.head turn it
into the logits of t_{i+2}. Drafting k > 1 tokens chains the one layer on its own output, as vLLM
does. The shape is EAGLE-1's (a feature in, the next feature out), so the EAGLE rider runs it
(`speculative.eagle` dispatches on `EagleConfig.version == MTP`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, ModelConfig
from jaxinfer.models.decoder import finish_logits
from jaxinfer.models.layers import Weight, linear, linear_transposed
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.registry import family_of
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.row_table import take_rows
from jaxinfer.parallel.array_info import ArrayInfo

if TYPE_CHECKING:
    from jaxinfer.speculative.eagle import EagleParams

# Architectures whose MTP layer is a decoder layer of their own family after the decoder's (vLLM's
# deepseek_mtp, glm4_moe_mtp and glm4_moe_lite_mtp); ERNIE 4.5's `model.mtp_*` block is laid out differently.
MTP_ARCHITECTURES = ("DeepseekV3ForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MtpWeights:
    """One MTP layer's weights; the target's embedding travels beside them (`EagleParams.embed`)."""

    enorm: jax.Array  # [D] norm of the token's embedding
    hnorm: jax.Array  # [D] norm of the target's hidden state
    eh_proj: Weight  # [2D, D] over [embedding; hidden]
    layer: Any  # the target family's layer dataclass (attention, MoE, its two norms)
    norm: jax.Array  # [D] shared_head.norm
    lm_head: Weight | None  # [D, V] shared_head.head; None: the target's


def check_mtp_target(target: ModelConfig) -> None:
    """Refuse method "mtp" for a target without an MTP layer it can run, naming what it has."""
    if target.architecture not in MTP_ARCHITECTURES:
        raise ConfigError(f'speculative method "mtp" runs the MTP layers of {", ".join(MTP_ARCHITECTURES)} '
                          f"checkpoints, not {target.architecture}'s; use \"eagle\", \"draft\" or \"ngram\"")
    if target.mtp_layers < 1:
        raise ConfigError(f'speculative method "mtp" needs MTP layers; this {target.architecture} checkpoint has '
                          f"num_nextn_predict_layers={target.mtp_layers}")


def mtp_layer_config(target: ModelConfig) -> ModelConfig:
    """The MTP layer as a one-layer model of the target's kind: layer 0 routes experts as the target's
    MoE layers do (the released MTP layers are all MoE layers)."""
    return dataclasses.replace(target, num_layers=1, mtp_layers=0, dense_layers=(), layer_windows=(0,),
                               layer_chunks=(0,), nope_layers=())


def abstract_mtp(layer_cfg: ModelConfig, own_head: bool) -> MtpWeights:
    """Every leaf of an MTP layer as an ArrayInfo (own_head: the checkpoint stores shared_head.head)."""
    D, V = layer_cfg.hidden_size, layer_cfg.vocab_size
    norm = lambda: ArrayInfo((D,), ("embed",), init_value=1.0)  # noqa: E731
    return MtpWeights(
        enorm=norm(), hnorm=norm(), eh_proj=ArrayInfo((2 * D, D), (None, "embed")),
        layer=family_of(layer_cfg).abstract_layer(layer_cfg, 0), norm=norm(),
        lm_head=ArrayInfo((D, V), ("embed", "vocab")) if own_head else None,
    )


def mtp_step(
    params: "EagleParams", tokens: jax.Array, hidden: jax.Array, positions: jax.Array, cache: Any,
    layer_cfg: ModelConfig,
) -> tuple[jax.Array, Any]:
    """The MTP layer at positions [B, T] (i) reading tokens [B, T] (t_{i+1}) and the target's pre-norm
    hidden states [B, T, D] (h_i): its output [B, T, D] (the next step's h) and the cache with its K/V."""
    w: MtpWeights = params.head
    eps = layer_cfg.rms_norm_eps
    embeds = take_rows(params.embed, tokens).astype(hidden.dtype)  # neither family scales its embeddings
    joined = jnp.concatenate([rms_norm(embeds, w.enorm, eps), rms_norm(hidden, w.hnorm, eps)], axis=-1)
    x = linear(joined, w.eh_proj)
    return family_of(layer_cfg).layer(layer_cfg, x, cache, w.layer, 0, positions, RopeTables(positions, layer_cfg))


def mtp_logits(params: "EagleParams", predicted: jax.Array, layer_cfg: ModelConfig) -> jax.Array:
    """Float32 logits [..., V] of the layer's outputs [..., D]: shared_head.norm, then shared_head.head."""
    w: MtpWeights = params.head
    normed = rms_norm(predicted, w.norm, layer_cfg.rms_norm_eps)
    head = w.lm_head if w.lm_head is not None else params.lm_head
    if head is None:
        logits = linear_transposed(normed, params.embed)
    else:
        logits = linear(normed, head, out_dtype=jnp.float32)
    return finish_logits(logits, params.lm_head_bias, params.logits_scaling, params.logit_soft_cap)

