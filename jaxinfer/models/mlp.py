"""The gated MLP every dense family uses (and each expert of the MoE ones)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.models.family import HFLeaf
from jaxinfer.models.layers import Weight, linear, linears
from jaxinfer.parallel.array_info import ArrayInfo


def activation(name: str, x: jax.Array) -> jax.Array:
    """The MLP gate nonlinearity by config name."""
    if name == "gelu_tanh":
        return jax.nn.gelu(x, approximate=True)
    if name == "gelu":
        return jax.nn.gelu(x, approximate=False)
    if name == "relu2":
        return jnp.square(jax.nn.relu(x))
    if name == "relu":
        return jax.nn.relu(x)
    return jax.nn.silu(x)


@dataclasses.dataclass(frozen=True)
class ClampedSwiGLU:
    """GPT-OSS's expert gate: g = min(gate, limit), u = clip(up, -limit, limit), (u + 1) * g * sigmoid(alpha * g).

    Hashable, so it travels as the static `act` of the expert code where other models pass a name.
    """

    alpha: float
    limit: float

    def __call__(self, gate: jax.Array, up: jax.Array) -> jax.Array:
        g = jnp.minimum(gate, self.limit)
        u = jnp.clip(up, -self.limit, self.limit)
        return (u + 1) * g * jax.nn.sigmoid(self.alpha * g)


@dataclasses.dataclass(frozen=True)
class ClampedSiLU:
    """GLM-5.3's and HY-V4's expert gate: silu(min(gate, limit)) * clip(up, -limit, limit) (hashable: see above)."""

    limit: float

    def __call__(self, gate: jax.Array, up: jax.Array) -> jax.Array:
        return jax.nn.silu(jnp.minimum(gate, self.limit)) * jnp.clip(up, -self.limit, self.limit)


@dataclasses.dataclass(frozen=True)
class SiLUClamped:
    """Step 3.7's gate: min(silu(gate), limit) * clip(up, -limit, limit), the clamp after the activation (hashable)."""

    limit: float

    def __call__(self, gate: jax.Array, up: jax.Array) -> jax.Array:
        return jnp.minimum(jax.nn.silu(gate), self.limit) * jnp.clip(up, -self.limit, self.limit)


Gate = str | ClampedSwiGLU | ClampedSiLU | SiLUClamped  # an activation name, or a gate that also transforms `up`


def gate_product(act: Gate, gate: jax.Array, up: jax.Array) -> jax.Array:
    """act(gate) * up; the activation runs in float32 and is rounded once, as torch computes it for
    bf16 inputs (in bf16 XLA rounded after each of its five operations: a tenth of a CPU prefill step)."""
    if not isinstance(act, str):
        return act(gate.astype(jnp.float32), up.astype(jnp.float32)).astype(gate.dtype)
    return activation(act, gate.astype(jnp.float32)).astype(gate.dtype) * up


def gated_mlp(x: jax.Array, gate: Weight, up: Weight, down: Weight, act: str) -> jax.Array:
    """down(act(x @ gate) * (x @ up)), weights stored [in, out]."""
    g, u = linears(x, [gate, up])
    return linear(gate_product(act, g, u), down)


def mlp_leaves(hidden: int, intermediate: int) -> dict[str, ArrayInfo]:
    """A gated MLP's fields as ArrayInfos."""
    return dict(
        w_gate=ArrayInfo((hidden, intermediate), ("embed", "mlp")),
        w_up=ArrayInfo((hidden, intermediate), ("embed", "mlp")),
        w_down=ArrayInfo((intermediate, hidden), ("mlp", "embed")),
    )


def mlp_hf_leaves(hidden: int, intermediate: int, prefix: str = "model.layers.{i}.mlp.") -> dict[str, HFLeaf]:
    """Where a gated MLP with separate gate/up/down projections lives in a checkpoint."""
    return {
        "w_gate": HFLeaf(prefix + "gate_proj.weight", "transpose", (intermediate, hidden)),
        "w_up": HFLeaf(prefix + "up_proj.weight", "transpose", (intermediate, hidden)),
        "w_down": HFLeaf(prefix + "down_proj.weight", "transpose", (hidden, intermediate)),
    }
