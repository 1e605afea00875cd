"""Falcon-H1's muP multipliers on a layer's sublayers, as a config holds them (`ModelConfig.multipliers`).

Falcon-H1 scales the normed input of its attention and of its Mamba2 mixer, each one's output, the MLP's gate
activations (before the nonlinearity) and its output, each by a scalar its config names. The embedding, logit, key
and in_proj multipliers need no field here: they ride on `embedding_multiplier`, `logits_scaling`, `attn_scale`
and `StateSpace.proj_multipliers`.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SublayerMultipliers:
    """Each a Python float, 1.0 for none (Falcon-H1's config names in comments)."""

    attention_in: float = 1.0  # attention_in_multiplier: the normed input attention reads
    attention_out: float = 1.0  # attention_out_multiplier
    ssm_in: float = 1.0  # ssm_in_multiplier: the normed input the mixer reads
    ssm_out: float = 1.0  # ssm_out_multiplier
    mlp_gate: float = 1.0  # mlp_multipliers[0]: the gate projection's output, before the activation
    mlp_down: float = 1.0  # mlp_multipliers[1]: the MLP's output
