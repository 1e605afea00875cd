"""Weight products: `linear` (one weight, dispatched on its leaf type) and `linears` (several on one input)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxinfer.kernels.cpu import PackedWeight, packed_matmul, packed_matmuls
from jaxinfer.kernels.precision import matmul_precision
from jaxinfer.models.invariant_weight import InvariantWeight, in_row_blocks
from jaxinfer.models.joined_weight import JoinedWeight, split_outputs
from jaxinfer.models.lora_weight import LoRAWeight, adapter_delta
from jaxinfer.quantization.quantized_weight import QuantizedWeight, one_kernel_call, quantized_matmul, tiled_matmuls

Weight = jax.Array | PackedWeight | QuantizedWeight | JoinedWeight | InvariantWeight | LoRAWeight


def linear(x: jax.Array, w: Weight, contract: int = 1, out_dtype: jnp.dtype | None = None) -> jax.Array:
    """Contract the last `contract` axes of x with the first ones of w, accumulating in float32.

    The result is returned in `out_dtype` (default x's dtype, as HF's linear layers). Asking XLA
    for a float32 result keeps bf16 weights bf16 on CPU: it has no bf16-output dot and rewrote
    a plain bf16 one to convert every weight to float32 at every step. Weights packed for the
    CPU kernel (bf16 on CPU, see `pack_for_cpu`) go to it: at decode it is about twice as fast.
    Quantized weights go to `quantized_matmul`, which reads them without a dequantized copy.
    A `LoRAWeight` adds each row's adapter product (bound per step, see lora_weight).
    """
    if isinstance(w, (PackedWeight, QuantizedWeight)) and w.contract != contract:
        raise ValueError(f"weight stored with contract={w.contract}, used with contract={contract}")
    x2 = x.reshape(-1, math.prod(w.shape[:contract]))
    return _shaped(_matmul(x2, w), x, w.shape[contract:], contract, out_dtype)


def _matmul(x2: jax.Array, w: Weight) -> jax.Array:
    """x2 [M, K] @ w (its first axes K) as float32 [M, N], by the weight's kind."""
    if isinstance(w, LoRAWeight):
        base = _matmul(x2, w.base)
        return base if w.token_slots is None else base + adapter_delta(x2, w)
    if isinstance(w, PackedWeight):
        return packed_matmul(x2, w)
    if isinstance(w, QuantizedWeight):
        return quantized_matmul(x2, w)
    if isinstance(w, InvariantWeight):
        inner = w.weight
        return in_row_blocks((lambda rows: linear_transposed(rows, inner)) if w.transposed else
                             (lambda rows: _matmul(rows, inner)), x2)
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
