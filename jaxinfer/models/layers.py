"""Building blocks shared by every Llama-family model: norms, rotary embeddings, gated MLP."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config.model import ModelConfig, RopeScaling
from jaxinfer.kernels.cpu import PackedWeight, packed_matmul, packed_matmuls
from jaxinfer.kernels.precision import matmul_precision
from jaxinfer.models.joined_weight import JoinedWeight, split_outputs
from jaxinfer.quantization.quantized_weight import QuantizedWeight, one_kernel_call, quantized_matmul, tiled_matmuls


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, weight_offset: float = 0.0) -> jax.Array:
    """RMSNorm computed in float32; Gemma (offset 1) scales before the cast, Llama after, as HF does."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if weight_offset:
        return (normed * (weight_offset + weight.astype(jnp.float32))).astype(x.dtype)
    return weight * normed.astype(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling) -> np.ndarray:
    """Inverse rotary frequencies [head_dim // 2] (float32), with linear or llama3 scaling."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)
    if scaling.rope_type == "linear":
        return (inv_freq / np.float32(scaling.factor)).astype(np.float32)
    if scaling.rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    return inv_freq


def _llama3_inv_freq(inv_freq: np.ndarray, s: RopeScaling) -> np.ndarray:
    """Llama 3.1 frequency scaling: long wavelengths slowed by `factor`, a smooth band between."""
    low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def rope_cos_sin(positions: jax.Array, cfg: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """cos, sin tables [*positions.shape, head_dim] in float32 for the given integer positions."""
    inv_freq = jnp.asarray(rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate x [B, T, heads, head_dim] by cos/sin [B, T, head_dim] (HF's rotate-half layout)."""
    cos = cos[:, :, None, :].astype(x.dtype)
    sin = sin[:, :, None, :].astype(x.dtype)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


Weight = jax.Array | PackedWeight | QuantizedWeight | JoinedWeight


def linear(x: jax.Array, w: Weight, contract: int = 1, out_dtype: jnp.dtype | None = None) -> jax.Array:
    """Contract the last `contract` axes of x with the first ones of w, accumulating in float32.

    The result is returned in `out_dtype` (default x's dtype, as HF's linear layers). Asking XLA
    for a float32 result keeps bf16 weights bf16 on CPU: it has no bf16-output dot and rewrote
    a plain bf16 one to convert every weight to float32 at every step. Weights packed for the
    CPU kernel (bf16 on CPU, see `pack_for_cpu`) go to it: at decode it is about twice as fast.
    Quantized weights go to `quantized_matmul`, which reads them without a dequantized copy.
    """
    if isinstance(w, (PackedWeight, QuantizedWeight)) and w.contract != contract:
        raise ValueError(f"weight stored with contract={w.contract}, used with contract={contract}")
    x2 = x.reshape(-1, math.prod(w.shape[:contract]))
    return _shaped(_matmul(x2, w), x, w.shape[contract:], contract, out_dtype)


def _matmul(x2: jax.Array, w: Weight) -> jax.Array:
    """x2 [M, K] @ w (its first axes K) as float32 [M, N], by the weight's kind."""
    if isinstance(w, PackedWeight):
        return packed_matmul(x2, w)
    if isinstance(w, QuantizedWeight):
        return quantized_matmul(x2, w)
    w2 = w.reshape(x2.shape[1], -1)
    return jnp.dot(x2, w2, precision=matmul_precision(x2, w2), preferred_element_type=jnp.float32)


def _shaped(y: jax.Array, x: jax.Array, out_shape: tuple[int, ...], contract: int, out_dtype: jnp.dtype | None) -> jax.Array:
    """A [rows, N] product in x's leading shape and the weight's output shape, in out_dtype (default x's)."""
    return y.reshape(*x.shape[: x.ndim - contract], *out_shape).astype(out_dtype or x.dtype)


def linears(x: jax.Array, ws: list[Weight | None]) -> list[jax.Array]:
    """`linear(x, w)` for each w (contract 1), as one product where the weights allow.

    q/k/v and gate/up multiply the same activations. Joined (a `JoinedWeight` first, None for
    the others) they are one matrix product; packed or tiled for the CPU kernels, one kernel
    call (the thread pool dispatched once and, for quantized weights, x rounded once).
    """
    x2 = x.reshape(-1, x.shape[-1])
    if isinstance(ws[0], JoinedWeight):
        if any(w is not None for w in ws[1:]) or len(ws) != len(ws[0].shapes):
            raise ValueError(f"a JoinedWeight of {len(ws[0].shapes)} parts stands for them all; the others must be None")
        ys = split_outputs(_matmul(x2, ws[0].weight), ws[0])
        return [_shaped(y, x, shape[1:], 1, None) for y, shape in zip(ys, ws[0].shapes)]
    if all(isinstance(w, PackedWeight) and w.contract == 1 for w in ws):
        ys = packed_matmuls(x2, ws)
    elif all(isinstance(w, QuantizedWeight) and w.contract == 1 for w in ws) and one_kernel_call(ws):
        ys = tiled_matmuls(x2, ws)
    else:
        return [linear(x, w) for w in ws]
    return [_shaped(y, x, w.shape[1:], 1, None) for y, w in zip(ys, ws)]


def linear_transposed(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [..., K] @ w[N, K].T as float32 [..., N] (an output head tied to the embedding)."""
    precision = matmul_precision(x, w)
    return jnp.einsum("...d,nd->...n", x, w, precision=precision, preferred_element_type=jnp.float32)


def activation(name: str, x: jax.Array) -> jax.Array:
    """The MLP gate nonlinearity by config name."""
    if name == "gelu_tanh":
        return jax.nn.gelu(x, approximate=True)
    if name == "gelu":
        return jax.nn.gelu(x, approximate=False)
    return jax.nn.silu(x)


def gated_mlp(x: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array, act: str) -> jax.Array:
    """down(act(x @ gate) * (x @ up)), weights stored [in, out].

    The activation runs in float32 and is rounded once, as torch computes it for bf16 inputs;
    in bf16 XLA rounded after each of its five operations (a tenth of a CPU prefill step).
    """
    g, u = linears(x, [gate, up])
    hidden = activation(act, g.astype(jnp.float32)).astype(g.dtype) * u
    return linear(hidden, down)
