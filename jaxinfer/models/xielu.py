"""xIELU (arXiv 2411.13010), Apertus' MLP activation, and the ungated MLP it runs in.

xIELU(x) = alpha_p * x^2 + beta * x for x > 0, else (expm1(min(x, eps)) - x) * alpha_n + beta * x,
with alpha_p = softplus(stored alpha_p) and alpha_n = beta + softplus(stored alpha_n), learned per layer.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.models.family import HFLeaf
from jaxinfer.models.layers import linear
from jaxinfer.parallel.array_info import ArrayInfo


def xielu(x: jax.Array, alpha_p: jax.Array, alpha_n: jax.Array, beta: jax.Array, eps: jax.Array) -> jax.Array:
    """xIELU of x, computed in float32 and rounded once to x's dtype."""
    x32 = x.astype(jnp.float32)
    beta, eps = beta.astype(jnp.float32), eps.astype(jnp.float32)
    slope_p = jax.nn.softplus(alpha_p.astype(jnp.float32))
    slope_n = beta + jax.nn.softplus(alpha_n.astype(jnp.float32))
    positive = slope_p * x32 * x32 + beta * x32
    negative = (jnp.expm1(jnp.minimum(x32, eps)) - x32) * slope_n + beta * x32
    return jnp.where(x32 > 0, positive, negative).astype(x.dtype)


def xielu_mlp(x: jax.Array, lw: Any) -> jax.Array:
    """down(xIELU(x @ up)): a layer with `w_up`, `w_down` and xIELU's `alpha_p alpha_n beta eps`."""
    h = linear(x, lw.w_up)
    return linear(xielu(h, lw.alpha_p, lw.alpha_n, lw.beta, lw.eps), lw.w_down)


def xielu_leaves() -> dict[str, ArrayInfo]:
    """xIELU's learned parameters as ArrayInfos (replicated: one number each)."""
    return dict(alpha_p=ArrayInfo((1,), (None,)), alpha_n=ArrayInfo((1,), (None,)),
                beta=ArrayInfo((), (), init_value=0.5), eps=ArrayInfo((), (), init_value=-1e-6))


def xielu_hf_leaves(prefix: str) -> dict[str, HFLeaf]:
    """Where xIELU's parameters live in a checkpoint (`prefix` ends with the activation's module)."""
    return {"alpha_p": HFLeaf(prefix + "alpha_p", "same", (1,)), "alpha_n": HFLeaf(prefix + "alpha_n", "same", (1,)),
            "beta": HFLeaf(prefix + "beta", "same", ()), "eps": HFLeaf(prefix + "eps", "same", ())}
