"""One buffer for a step's small arrays: every leaf comes back bit for bit, both ways."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.runtime.packed_tree import PackedTree, pack_device, pack_host, unpack_device, unpack_host


def _tree(rng: np.random.Generator) -> dict:
    """Every packable dtype, odd shapes, a scalar, an empty leaf, None and float specials."""
    floats = rng.standard_normal((3, 5)).astype(np.float32)
    floats[0, :3] = [np.inf, -0.0, np.nan]
    return {
        "ids": rng.integers(-(2**31), 2**31 - 1, (7,), dtype=np.int32),
        "keys": rng.integers(0, 2**32 - 1, (4, 2), dtype=np.uint32),
        "floats": floats,
        "mask": rng.random((2, 3)) < 0.5,
        "scalar": np.int32(9),
        "empty": np.zeros((0, 4), np.int32),
        "absent": None,
    }


def _assert_same(got: dict, want: dict) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        g = np.asarray(g)
        assert g.dtype == np.asarray(w).dtype and g.shape == np.shape(w)
        np.testing.assert_array_equal(np.atleast_1d(g).view(np.uint8), np.atleast_1d(w).view(np.uint8))  # bits, NaN too


@pytest.mark.parametrize("seed", [0, 1])
def test_host_to_program_to_host_keeps_every_bit(seed):
    tree = _tree(np.random.default_rng(seed))
    packed = pack_host(tree)
    assert isinstance(packed, PackedTree) and packed.buffer.dtype == np.int32 and packed.buffer.ndim == 1

    @jax.jit
    def echo(p):
        inside = unpack_device(p)
        assert jax.tree.structure(inside) == jax.tree.structure(tree)
        assert [(x.shape, x.dtype) for x in jax.tree.leaves(inside)] == [
            (np.shape(x), np.asarray(x).dtype) for x in jax.tree.leaves(tree)]
        return pack_device(inside)

    _assert_same(unpack_host(jax.device_get(echo(packed))), tree)


def test_program_outputs_come_back_packed():
    out = jax.jit(lambda x: pack_device({"sum": x.sum(0), "big": x > 0, "half": (x / 2).astype(jnp.float32)}))(
        jnp.arange(-3, 9, dtype=jnp.int32).reshape(3, 4))
    got = unpack_host(jax.device_get(out))
    x = np.arange(-3, 9, dtype=np.int32).reshape(3, 4)
    _assert_same(got, {"big": x > 0, "half": (x / 2).astype(np.float32), "sum": x.sum(0).astype(np.int32)})


def test_unpacked_arguments_pass_through():
    tree = {"a": np.ones(3, np.int32)}
    assert unpack_device(tree) is tree


def test_unpackable_dtype_is_named():
    with pytest.raises(TypeError, match="cannot pack a int64 leaf of shape \\(2,\\); packable dtypes: int32"):
        pack_host({"x": np.zeros(2, np.int64)})
