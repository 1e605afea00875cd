"""Matmul precision by operand dtype: float32 means float32 on every platform.

XLA computes float32 dots in TF32 on recent NVIDIA GPUs and in bf16 passes on TPU unless
asked otherwise, which moved float32 logits by ~1e-3 from HF's. Each call site asks for
HIGHEST when an operand is float32; bf16/fp16 keep the fast default. A per-call setting, not
the global `jax_default_matmul_precision`, so one process can serve both kinds of model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def matmul_precision(*operands: jax.Array) -> jax.lax.Precision | None:
    """HIGHEST when any operand is float32, else None (XLA's default for the dtype)."""
    if any(jnp.dtype(x.dtype) == jnp.float32 for x in operands):
        return jax.lax.Precision.HIGHEST
    return None
