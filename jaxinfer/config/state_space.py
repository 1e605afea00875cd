"""The shape of a model's Mamba2 state-space layers, as a config holds it (`ModelConfig.state_space`).

A layer listed in `layers` runs a Mamba2 mixer (models/mamba2_mixer) in place of attention: it keeps
no K/V per token but a fixed-size recurrent state per request (a conv state of the last conv_kernel - 1
inputs and an SSM state per head), which the engine keeps in a pool indexed by the request's row slot
(cache/state_pool).
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class StateSpace:
    """Mamba2's dims (HF names in comments)."""

    layers: tuple[int, ...]  # the decoder layers that are Mamba2 mixers
    num_heads: int  # H (mamba_n_heads / num_heads)
    head_dim: int  # P (mamba_d_head / head_dim)
    state_size: int  # N (mamba_d_state / state_size)
    n_groups: int  # G: B and C are shared by H / G heads each (mamba_n_groups / n_groups)
    conv_kernel: int  # K: the causal depthwise conv's width (mamba_d_conv / conv_kernel)
    conv_bias: bool = True  # mamba_conv_bias / use_conv_bias
    proj_bias: bool = False  # in_proj and out_proj biases (mamba_proj_bias / use_bias)
    norm_eps: float = 1e-6  # the gated RMSNorm's epsilon
    time_step_limit: tuple[float, float] = (0.0, math.inf)  # dt is clamped to it after the softplus
    residual_in_fp32: bool = False  # Mamba2's residual stream kept in float32 across its layers (residual_in_fp32)
    # the chunked SSD's chunk (chunk_size / mamba_chunk_size); a step of at least this many tokens runs it
    chunk_size: int = 256

    def __post_init__(self) -> None:
        """Refuse a chunk the chunked SSD cannot cut a step into."""
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size {self.chunk_size!r} is not supported for the Mamba2 mixer: give a positive "
                             "token count (mamba_chunk_size for hybrids)")

    @property
    def inner(self) -> int:
        """The mixer's width: H * P (expand * hidden_size)."""
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels the conv runs over: x, then B and C (inner + 2 * G * N)."""
        return self.inner + 2 * self.n_groups * self.state_size

    @property
    def projected(self) -> int:
        """in_proj's outputs: the gate z, the conv's channels, then dt per head."""
        return self.inner + self.conv_dim + self.num_heads

    def state_bytes(self) -> int:
        """Float32 bytes of one request's state in one layer (conv and SSM)."""
        return 4 * ((self.conv_kernel - 1) * self.conv_dim + self.num_heads * self.head_dim * self.state_size)
