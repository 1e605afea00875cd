"""MiniMax-Text-01's settings beside Mixtral's, as a config holds them (`ModelConfig.minimax`; models/minimax).

Every sublayer's output meets its normed input weighted (alpha * input + beta * output), by the sublayer's kind. Its
lightning-attention layers decay their state by per-head rates that depend on the layer's index (transformers'
`MiniMaxLightningAttention.get_slope_rate`): `decay_rates`, which models/minimax hands each such layer as it runs.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class MiniMaxFields:
    """The residual weights (HF names in comments)."""

    linear_factors: tuple[float, float]  # (linear_attn_alpha_factor, linear_attn_beta_factor)
    full_factors: tuple[float, float]  # (full_attn_alpha_factor, full_attn_beta_factor)
    mlp_factors: tuple[float, float]  # (mlp_alpha_factor, mlp_beta_factor)


def decay_rates(heads: int, layer: int, num_layers: int) -> tuple[float, ...]:
    """A lightning layer's per-head decay rates, as transformers computes them: 2 ** (-8 (h + 1) / heads), scaled
    down linearly with depth (1 + 1e-5 at the first layer, 1e-5 at the last)."""
    factor = 1 - layer / (num_layers - 1 + 1e-5) + 1e-5
    return tuple((2 ** (-8 / heads)) ** (h + 1) * factor for h in range(heads))
