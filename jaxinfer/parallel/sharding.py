"""Device meshes and the one logical-axis rules table that weights, KV caches and activations share.

A `Layout` is a mesh (axes "dp", "ep" and "tp") plus the rules table. Every array is described by
logical axis names (`ArrayInfo.axes` for weights; fixed names for caches and activations) and
`Layout.spec` turns them into a PartitionSpec. The unsharded layout has no mesh: every spec is
empty and `constrain`/`put` do nothing, so single-device code is the same code.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

DP, EP, TP = "dp", "ep", "tp"
# Logical axis -> mesh axis. Tensor parallel splits heads, the MLP and the vocabulary;
# data parallel splits the batch (sequence rows, or the flat token stream of an engine step);
# expert parallel splits a mixture-of-experts layer's experts (everything else is replicated over it).
RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", DP),
    ("tokens", DP),
    ("vocab", TP),
    ("embed", None),
    ("q_heads", TP),
    ("kv_heads", TP),
    ("head_dim", None),
    ("mlp", TP),
    ("experts", EP),
)

Axes = Sequence[str | None]


def divisors(n: int, limit: int) -> list[int]:
    """Divisors of n up to limit (the sizes a split of n into equal parts can take)."""
    return [d for d in range(1, limit + 1) if n % d == 0]


def make_mesh(tp: int = 1, dp: int = 1, devices: Sequence[jax.Device] | None = None, ep: int = 1) -> Mesh:
    """A (dp, ep, tp) mesh over the first dp * ep * tp devices (all processes' devices, in jax order).

    Axis types are given explicitly (Auto: XLA propagates shardings from the constrained
    arrays), so the mesh means the same on jax versions whose `make_mesh` defaults differ.
    """
    for name, value in (("tp", tp), ("dp", dp), ("ep", ep)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    devices = list(jax.devices() if devices is None else devices)
    size = tp * dp * ep
    if size > len(devices):
        raise ValueError(
            f"tp={tp} x dp={dp} x ep={ep} needs {size} devices, but {len(devices)} are present; choose "
            f"tp * dp * ep <= {len(devices)} (for example tp={largest_at_most(len(devices), tp)}, dp=1, ep=1)"
        )
    axis_types = (AxisType.Auto,) * 3
    return jax.make_mesh((dp, ep, tp), (DP, EP, TP), axis_types=axis_types, devices=devices[:size])


def largest_at_most(n: int, limit: int) -> int:
    """The largest power of two <= min(n, limit) (a device count that always fits)."""
    return 1 << (min(n, limit).bit_length() - 1)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where arrays live: a mesh (None: one device, nothing sharded) and the logical-axis rules."""

    mesh: Mesh | None = None
    rules: tuple[tuple[str, str | None], ...] = RULES

    @property
    def size(self) -> int:
        """Devices in the mesh (1 when unsharded)."""
        return 1 if self.mesh is None else self.mesh.size

    def axis_size(self, mesh_axis: str) -> int:
        """Devices along one mesh axis (1 when unsharded or the mesh has no such axis)."""
        return 1 if self.mesh is None else self.mesh.shape.get(mesh_axis, 1)

    def spec(self, shape: Sequence[int], axes: Axes) -> PartitionSpec:
        """The PartitionSpec of an array; a dimension its mesh axis does not divide stays whole."""
        if self.mesh is None:
            return PartitionSpec()
        table, used, out = dict(self.rules), set(), []
        for dim, name in zip(shape, axes):
            mesh_axis = table.get(name) if name is not None else None
            fits = mesh_axis is not None and mesh_axis not in used and dim % self.axis_size(mesh_axis) == 0
            out.append(mesh_axis if fits and self.axis_size(mesh_axis) > 1 else None)
            used.add(out[-1])
        return PartitionSpec(*out)

    def parts(self, shape: Sequence[int], axes: Axes) -> int:
        """Pieces an array of this shape is split into (1 when every device holds all of it)."""
        return math.prod(self.axis_size(a) for a in self.spec(shape, axes) if a is not None)

    def sharding(self, shape: Sequence[int], axes: Axes) -> NamedSharding | None:
        """The NamedSharding of an array (None when unsharded)."""
        return None if self.mesh is None else NamedSharding(self.mesh, self.spec(shape, axes))

    def constrain(self, x: jax.Array, axes: Axes) -> jax.Array:
        """x pinned to its layout inside a traced function (x itself when unsharded)."""
        if self.mesh is None:
            return x
        return jax.lax.with_sharding_constraint(x, self.sharding(x.shape, axes))

    def replicated(self, x: jax.Array) -> jax.Array:
        """x pinned to every device inside a traced function (small outputs every process reads)."""
        return self.constrain(x, (None,) * x.ndim)

    def zeros(self, shape: tuple[int, ...], dtype: Any, axes: Axes) -> jax.Array:
        """A zeroed array made directly in its layout (no full copy on one device first)."""
        if self.mesh is None:
            return jnp.zeros(shape, dtype)
        return jnp.zeros(shape, dtype, device=self.sharding(shape, axes))

    def put(self, x: Any, axes: Axes | None = None) -> jax.Array:
        """A host array on the devices (replicated when axes is None); every process passes the same x."""
        if self.mesh is None:  # a transfer: jnp.asarray would compile a copy program per shape
            return x if isinstance(x, jax.Array) else jax.device_put(np.asarray(x))
        x = np.asarray(x)
        return jax.device_put(x, self.sharding(x.shape, axes or (None,) * x.ndim))

    def put_tree(self, tree: Any) -> Any:
        """A pytree of host arrays ready to pass to a program, replicated over the mesh.

        Without a mesh the tree goes as it is: jit's C++ dispatch moves NumPy arguments ~10x
        faster than `jax.device_put` of the tree (0.5 ms for an engine step's 15 small arrays).
        """
        if self.mesh is None:
            return tree
        return jax.tree.map(lambda leaf: self.put(np.asarray(leaf)), tree)

    def from_callback(self, shape: tuple[int, ...], dtype: Any, axes: Axes, read: Callable) -> jax.Array:
        """An array made shard by shard: read(index) returns the host slice each device holds."""
        if self.mesh is None:
            return jax.device_put(np.asarray(read(tuple(slice(0, n) for n in shape))))
        cache: dict[tuple, np.ndarray] = {}

        def shard(index: tuple[slice, ...]) -> np.ndarray:
            bounds = tuple(s.indices(n)[:2] for s, n in zip(index, shape))
            if bounds not in cache:  # replicas of one slice are read once
                cache[bounds] = np.asarray(read(tuple(slice(a, b) for a, b in bounds)), dtype)
            return cache[bounds]

        return jax.make_array_from_callback(shape, self.sharding(shape, axes), shard)


UNSHARDED = Layout()


def shard_map(f: Callable, layout: Layout, in_specs: Any, out_specs: Any) -> Callable:
    """f run once per device of layout's mesh on its own shards (jax.shard_map, or the older experimental one).

    Replication checks are off: Pallas calls inside have no replication rule to check.
    """
    if hasattr(jax, "shard_map"):
        return jax.shard_map(f, mesh=layout.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    from jax.experimental.shard_map import shard_map as experimental_shard_map

    return experimental_shard_map(f, layout.mesh, in_specs, out_specs, check_rep=False)


def check_layout(num_heads: int, num_kv_heads: int, tp: int, dp: int, num_devices: int, ep: int = 1) -> None:
    """Raise ValueError for a layout the model cannot take, naming sizes that would work."""
    if tp * dp * ep > num_devices:
        parts = f"tensor_parallel_size={tp} x data_parallel_size={dp}" + (f" x expert_parallel_size={ep}" if ep > 1 else "")
        raise ValueError(
            f"{parts} needs {tp * dp * ep} devices, but "
            f"{num_devices} are present; sizes whose product is <= {num_devices} work "
            f"(tensor_parallel_size one of {divisors(num_heads, num_devices)})"
        )
    if num_heads % tp:
        raise ValueError(
            f"tensor_parallel_size={tp} does not divide the model's {num_heads} attention heads; "
            f"use one of {divisors(num_heads, num_devices)}"
        )
    if num_kv_heads % tp and tp % num_kv_heads:
        # Each shard must hold whole kv heads: a split of them (kv % tp == 0) or all of them,
        # where the shard's query heads share one kv head (tp % kv == 0).
        good = [d for d in divisors(num_heads, num_devices) if num_kv_heads % d == 0 or d % num_kv_heads == 0]
        raise ValueError(
            f"tensor_parallel_size={tp} splits the model's {num_kv_heads} kv heads unevenly "
            f"(neither divides the other); use one of {good}"
        )


def check_experts(num_experts: int, ep: int) -> None:
    """Raise ValueError unless expert_parallel_size splits the model's experts evenly."""
    if ep > 1 and not num_experts:
        raise ValueError(f"expert_parallel_size={ep} needs a mixture-of-experts model; this one has no experts "
                         "(use expert_parallel_size=1)")
    if num_experts % ep:
        raise ValueError(f"expert_parallel_size={ep} does not divide the model's {num_experts} experts; use one of "
                         f"{divisors(num_experts, num_experts)}")


def layout_for(num_heads: int, num_kv_heads: int, tp: int = 1, dp: int = 1, ep: int = 1) -> Layout:
    """The layout for tp x dp x ep devices after checking the model allows it; UNSHARDED for 1 x 1 x 1."""
    check_layout(num_heads, num_kv_heads, tp, dp, len(jax.devices()), ep)
    if tp * dp * ep == 1:
        return UNSHARDED
    return Layout(make_mesh(tp=tp, dp=dp, ep=ep))


def to_host(tree: Any) -> Any:
    """A pytree of device arrays as NumPy on this process, gathered from other processes when needed."""
    leaves = jax.tree.leaves(tree)
    if all(getattr(x, "is_fully_addressable", True) for x in leaves):
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), tree)


def shard_shapes(x: jax.Array) -> list[tuple[int, ...]]:
    """Shape of the part of x each addressable device holds (tests and diagnostics)."""
    return [tuple(s.data.shape) for s in x.addressable_shards]

