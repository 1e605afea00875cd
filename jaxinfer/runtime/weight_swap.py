"""New values for a served model's weight leaves, made exactly like the ones they replace.

A replaced leaf keeps the old one's type, shape, dtype and sharding, so the compiled step programs
run the new weights as they are (no recompile): a float leaf given for a quantized one is quantized
in the same mode and group, a float32 leaf for a bf16 one cast, each placed where the old one was
(a device-to-device copy when it is already on the devices). Anything else is refused by path.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.checkpoint.leaf_paths import leaf_paths
from jaxinfer.quantization import quantized_weight
from jaxinfer.quantization.quantized_experts import QuantizedExperts, quantize_experts
from jaxinfer.quantization.quantized_weight import QuantizedWeight

WEIGHT_TYPES = (QuantizedWeight, QuantizedExperts)  # one leaf each, though pytrees of values and scales


def is_weight(x: Any) -> bool:
    return isinstance(x, WEIGHT_TYPES)


def weight_leaves(tree: Any) -> dict[str, Any]:
    """{dotted path: leaf} of a weights tree, a quantized weight one leaf ('layers.0.wq', 'embed', ...)."""
    return dict(leaf_paths(tree, is_weight))


def float_shape(leaf: Any) -> tuple[int, ...]:
    """The shape of the float weight a leaf holds (a quantized one: before packing)."""
    if isinstance(leaf, QuantizedWeight):
        return tuple(leaf.shape)
    if isinstance(leaf, QuantizedExperts):
        e, k, n = leaf.values.shape
        return (e, k * 2, n) if leaf.mode in ("int4", "mxfp4") else (e, k, n)
    return tuple(leaf.shape)


def _quantized_like(new: jax.Array, old: Any, path: str) -> Any:
    """`new` quantized in `old`'s mode and group (jaxinfer's rounding), in `old`'s layout."""
    if isinstance(old, QuantizedWeight):
        q = quantized_weight.quantize(new, old.contract, old.mode, old.group or quantized_weight.DEFAULT_GROUP, path)
    else:
        q = quantize_experts(new, old.mode, old.group, path)
    return in_layout_of(q, old)


def in_layout_of(q: Any, old: Any) -> Any:
    """A symmetric int4 weight in the layout of a 4-bit checkpoint's leaf `old`: its scales' dtype, zero levels
    of 8 (the symmetric level) where it has zero levels, the identity input order where it has an act order."""
    if q.mode != "int4":
        return q
    fields = dict(scales=q.scales.astype(old.scales.dtype))
    if old.zeros is not None:
        fields["zeros"] = jnp.full(old.zeros.shape, 8, old.zeros.dtype)
    if getattr(old, "perm", None) is not None:
        fields["perm"] = jnp.arange(old.perm.shape[0], dtype=old.perm.dtype)
    return dataclasses.replace(q, **fields)


def _check_type(new: Any, old: Any, path: str) -> None:
    if is_weight(new) and jax.tree.structure(new) != jax.tree.structure(old):
        raise ValueError(f"weights[{path!r}] is a {type(new).__name__} {jax.tree.structure(new)}; the served leaf is "
                         f"{jax.tree.structure(old)}: give a float array (quantized as served) or the same format")


def leaf_like(new: Any, old: Any, path: str, owned: bool = False) -> Any:
    """`new` as the served leaf `old` holds it: quantized in its format, in its dtype, in its sharding.

    owned: `new` was made for this (read from a file), so its buffers may become the served ones; a
    caller's are copied (running the weights may consume buffers, and a trainer may write to its own).
    """
    _check_type(new, old, path)
    if not is_weight(new):
        new = jnp.asarray(new) if not isinstance(new, jax.Array) else new
        if tuple(new.shape) != float_shape(old):
            raise ValueError(f"weights[{path!r}] has shape {tuple(new.shape)}, expected {float_shape(old)}")
        if not jnp.issubdtype(new.dtype, jnp.floating):
            raise ValueError(f"weights[{path!r}] has dtype {new.dtype}; expected a float array")
        new = _quantized_like(new, old, path) if is_weight(old) else new.astype(old.dtype)
    for n, o in zip(jax.tree.leaves(new), jax.tree.leaves(old)):
        if n.shape != o.shape or n.dtype != o.dtype:
            raise ValueError(f"weights[{path!r}] holds {n.dtype}{list(n.shape)} where the served leaf holds "
                             f"{o.dtype}{list(o.shape)}")
    alias = None if owned else False
    return jax.tree.map(lambda n, o: jax.device_put(n, o.sharding, may_alias=alias), new, old)


def replaced(current: Any, updates: dict[str, Any], owned: bool = False) -> Any:
    """`current` with the leaves at updates' paths replaced (each made like the one it replaces; owned: see
    `leaf_like`)."""
    leaves = weight_leaves(current)
    unknown = sorted(set(updates) - set(leaves))
    if unknown:
        raise ValueError(f"{len(unknown)} weight path(s) are not leaves of this model (first: {unknown[:5]}); "
                         f"its leaves are {list(leaves)[:4]} ...")
    new = {path: leaf_like(updates[path], old, path, owned) if path in updates else old for path, old in leaves.items()}
    flat, treedef = jax.tree.flatten(current, is_leaf=is_weight)
    return jax.tree.unflatten(treedef, [new[p] for p in leaves])


def check_twins(new: Any, old: Any, what: str) -> None:
    """ValueError unless `new` has `old`'s tree, types, shapes, dtypes and shardings (the compiled programs'
    inputs), naming the first leaf that differs."""
    if jax.tree.structure(new) != jax.tree.structure(old):
        raise ValueError(f"new {what} are not laid out as the served ones: {jax.tree.structure(new)} vs "
                         f"{jax.tree.structure(old)}")
    for (path, n), o in zip(jax.tree_util.tree_flatten_with_path(new)[0], jax.tree.leaves(old)):
        if (n.shape, n.dtype, n.sharding) != (o.shape, o.dtype, o.sharding):
            raise ValueError(f"new {what} at {jax.tree_util.keystr(path)}: {n.dtype}{list(n.shape)} on "
                             f"{n.sharding}, the served {o.dtype}{list(o.shape)} on {o.sharding}")
