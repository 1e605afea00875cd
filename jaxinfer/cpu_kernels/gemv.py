"""One-row bf16 matmul on CPU (see gemv.cc), and when a projection should use it."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.cpu_kernels.build import load

TARGET = "jaxinfer_bf16_gemv"


def gemv_applies(rows: int, w: jax.Array) -> bool:
    """Whether a product of `rows` activation rows with weight w should use the kernel.

    Only one row on a single CPU device: from two rows on, XLA's own bf16 dot is faster.
    """
    return (
        rows == 1
        and w.dtype == jnp.bfloat16
        and w.ndim == 2
        and jax.default_backend() == "cpu"
        and jax.device_count() == 1
        and load("gemv.cc", "JaxinferBf16Gemv", TARGET)
    )


def bf16_gemv(x: jax.Array, w: jax.Array, transposed: bool = False) -> jax.Array:
    """x [K] @ w ([K, N], or [N, K] if transposed) as float32 [N]; w must be bfloat16."""
    n = w.shape[0] if transposed else w.shape[1]
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((n,), jnp.float32), vmap_method="sequential")
    return call(x.astype(jnp.float32), w, transposed=transposed)
