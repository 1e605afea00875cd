"""The shape of a model's state layers, as a config holds it (`ModelConfig.state_space`).

A layer listed in `layers` runs a Mamba2 mixer (models/mamba2_mixer) in place of attention: it keeps
no K/V per token but a fixed-size recurrent state per request (a conv state of the last conv_kernel - 1
inputs and an SSM state per head), which the engine keeps in a pool indexed by the request's row slot
(cache/state_pool). Falcon-H1's layers run the mixer beside attention (`parallel_attention`: they keep
K/V too); LFM2's short-conv layers (`StateSpace.short_conv`) keep a conv state alone (no SSM heads). Mamba-1's
selective mixer (`StateSpace.selective`: Mamba, FalconMamba, Jamba) keeps a [state_size] row per inner channel:
its channels are the "heads" (head_dim 1), so the pools keep Mamba2's shapes; Zamba's splits its channels into
`selective_heads` groups, each with its own x_proj, dt_proj, B and C.
"""

from __future__ import annotations

import dataclasses
import math

GATES = ("norm_gated", "norm_then_gate", "gate")  # how the mixer's output meets its gate z (see `gate`)


@dataclasses.dataclass(frozen=True)
class StateSpace:
    """Mamba2's dims (HF names in comments); a short conv's (LFM2) are its conv's alone."""

    layers: tuple[int, ...]  # the decoder layers that keep a state (Mamba2 mixers, LFM2's short convs)
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
    # the chunked SSD's chunk (chunk_size / mamba_chunk_size); a step of at least this many tokens runs it (Mamba-1's
    # chunked selective scan too, in chunks of at most this many: models/selective_chunks.chunk_tokens)
    chunk_size: int = 256
    # y meets the gate z: "norm_gated" RMSNorm(y * silu(z)) (Mamba2's), "norm_then_gate" RMSNorm(y) * silu(z),
    # "gate" y * silu(z) with no norm (Falcon-H1 without mamba_rms_norm; with it and mamba_norm_before_gate:
    # "norm_then_gate")
    gate: str = "norm_gated"
    # in_proj's outputs scaled per part (z, x, B, C, dt) before anything reads them (Falcon-H1's ssm_multipliers)
    proj_multipliers: tuple[float, float, float, float, float] = (1.0, 1.0, 1.0, 1.0, 1.0)
    parallel_attention: bool = False  # each state layer also attends (Falcon-H1): its K/V kept beside the state
    conv_channels: int = 0  # a short-conv layer's (LFM2) conv width; 0: Mamba2's (x, B, C)
    time_step_rank: int = 0  # Mamba-1's dt rank (time_step_rank / mamba_dt_rank); 0: not Mamba-1's mixer
    bcdt_norm: bool = False  # Mamba-1's dt, B and C RMS-normed (FalconMamba's, Jamba's), norm_eps their epsilon
    # Mamba-1's channels in this many heads, each with its own x_proj, dt_proj, B and C (Zamba's n_mamba_heads)
    selective_heads: int = 1
    interleaved_gate: bool = False  # Mamba-1's in_proj rows alternate x and the gate z per channel (Zamba's)
    # the Gated DeltaNet's gated norm takes its weight in float32, the normed y never rounded (LaraMini's)
    strict_gate_norm: bool = False
    # the Gated DeltaNet's beta = beta_scale * sigmoid(b): 2.0 lets its state's eigenvalues turn negative (OLMo
    # Hybrid's linear_allow_neg_eigval)
    beta_scale: float = 1.0
    key_decay: bool = False  # the DeltaNet's state decays per key channel, not per head: Kimi Delta Attention's
    # KDA's safe forget gate (the Ling hybrid's kda_lower_bound under kda_safe_gate): log decay bound * sigmoid(..);
    # 0: Kimi's -exp(A_log) * softplus(..)
    decay_lower_bound: float = 0.0

    def __post_init__(self) -> None:
        """Refuse a chunk the chunked SSD cannot cut a step into, and a gate it does not know."""
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size {self.chunk_size!r} is not supported for the Mamba2 mixer: give a positive "
                             "token count (mamba_chunk_size for hybrids)")
        if self.selective_heads < 1 or self.inner % self.selective_heads:
            raise ValueError(f"{self.selective_heads} Mamba heads must divide the mixer's {self.inner} channels")
        if self.gate not in GATES:
            raise ValueError(f"gate {self.gate!r} is not supported for the Mamba2 mixer; supported: {list(GATES)}")

    @classmethod
    def short_conv(cls, layers: tuple[int, ...], channels: int, kernel: int, bias: bool) -> StateSpace:
        """The state of gated short-conv layers (LFM2): the last kernel - 1 inputs of `channels` channels, no SSM;
        bias: the conv's and its two projections' (LFM2's conv_bias)."""
        return cls(layers=layers, num_heads=0, head_dim=0, state_size=0, n_groups=1, conv_kernel=kernel,
                   conv_channels=channels, conv_bias=bias, proj_bias=bias)

    @classmethod
    def selective(cls, layers: tuple[int, ...], inner: int, state_size: int, kernel: int, rank: int, conv_bias: bool,
                  proj_bias: bool, bcdt_norm_eps: float | None = None) -> StateSpace:
        """Mamba-1's selective mixer (models/mamba1_mixer) of `inner` channels, each with its own `state_size`
        decays; bcdt_norm_eps: the epsilon of its dt, B and C norms, None without them (Mamba's)."""
        if rank < 1:
            raise ValueError(f"time_step_rank {rank!r} is not supported for the Mamba mixer: give a positive rank")
        return cls(layers=layers, num_heads=inner, head_dim=1, state_size=state_size, n_groups=1, conv_kernel=kernel,
                   conv_channels=inner, conv_bias=conv_bias, proj_bias=proj_bias, time_step_rank=rank,
                   bcdt_norm=bcdt_norm_eps is not None, norm_eps=1e-6 if bcdt_norm_eps is None else bcdt_norm_eps)

    @classmethod
    def rg_lru(cls, layers: tuple[int, ...], width: int, kernel: int) -> StateSpace:
        """Griffin's recurrent blocks (RecurrentGemma: models/rg_lru): a biased conv over `width` channels and one
        recurrent value per channel (the pools' [S, width, 1, 1])."""
        return cls(layers=layers, num_heads=width, head_dim=1, state_size=1, n_groups=1, conv_kernel=kernel,
                   conv_channels=width)

    @property
    def has_ssm(self) -> bool:
        """Whether the layers keep an SSM state (Mamba2's) beside the conv state (not a short conv's)."""
        return self.num_heads > 0

    @property
    def inner(self) -> int:
        """The mixer's width: H * P (expand * hidden_size)."""
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels the conv runs over: x, then B and C (inner + 2 * G * N); a short conv's own width."""
        return self.conv_channels or self.inner + 2 * self.n_groups * self.state_size

    @property
    def projected(self) -> int:
        """in_proj's outputs: the gate z, the conv's channels, then dt per head."""
        return self.inner + self.conv_dim + self.num_heads

    def state_bytes(self) -> int:
        """Float32 bytes of one request's state in one layer (conv and SSM)."""
        return 4 * ((self.conv_kernel - 1) * self.conv_dim + self.num_heads * self.head_dim * self.state_size)
