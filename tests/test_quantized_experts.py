"""Routed experts stored quantized: each expert quantized as a projection would be, the grouped products
over the stored values against the same products over the dequantized weights, shardings on a mesh."""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from accelerator_programs import round_trips
from jax import export
from jax.sharding import AbstractMesh, PartitionSpec

from jaxinfer.checkpoint import mxfp4 as checkpoint_mxfp4
from jaxinfer.checkpoint.converted import QUANT_KEY, save_converted
from jaxinfer.checkpoint.loader import load_weights
from jaxinfer.models import abstract_weights, leaf_quantizer, load_config, quantize_weights
from jaxinfer.models.grouped_matmul import expert_mlp
from jaxinfer.models.weight_ops import map_projections
from jaxinfer.parallel.sharding import Layout
from jaxinfer.quantization.quantized_experts import (
    QuantizedExperts,
    dequantize_experts,
    experts_spec,
    quantize_experts,
    row_experts,
)
from jaxinfer.quantization.quantized_weight import dequantize, quantize

E, D, F = 4, 64, 32
MODES = ("int8", "int4", "fp8", "mxfp4")
PROJECTION_MODES = ("int8", "int4", "fp8")


def _weights(shape: tuple[int, ...], seed: int) -> jax.Array:
    return jnp.asarray(np.random.RandomState(seed).randn(*shape), jnp.float32)


@pytest.mark.parametrize("mode", PROJECTION_MODES)
def test_each_expert_is_quantized_as_a_projection_of_its_own(mode):
    """Values and scales of expert e are those of `quantize(w[e])`: the same format, one expert at a time."""
    w = _weights((E, D, F), 0) * jnp.arange(1, E + 1)[:, None, None]  # experts of different ranges
    q = quantize_experts(w, mode, 32)
    assert q.shape == (E, D, F)
    for e in range(E):
        alone = quantize(w[e], 1, mode, 32)
        np.testing.assert_array_equal(np.asarray(q.values[e], np.float32), np.asarray(alone.values, np.float32))
        np.testing.assert_array_equal(q.scales[e], alone.scales)
        np.testing.assert_array_equal(dequantize_experts(q)[e], dequantize(alone))


# Gaussian weights: int8's rounding step is absmax / 127 (~2.5 / 127 of the deviation), ~0.6% in rms.
@pytest.mark.parametrize("mode,tolerance", [("int8", 0.008), ("int4", 0.12), ("fp8", 0.07), ("mxfp4", 0.15)])
def test_dequantized_experts_are_close(mode, tolerance):
    w = _weights((E, D, F), 1)
    error = jnp.linalg.norm(dequantize_experts(quantize_experts(w, mode, 32)) - w) / jnp.linalg.norm(w)
    assert error < tolerance, (mode, float(error))


@pytest.mark.parametrize("implementation", ["tiled", "ragged_dot", "gathered"])
@pytest.mark.parametrize("mode", MODES)
def test_grouped_products_read_the_stored_values_as_the_dequantized_weights(implementation, mode):
    """Each row through its expert's quantized MLP equals the float MLP over the dequantized experts."""
    stacks = [quantize_experts(_weights(shape, seed), mode, 32) for seed, shape in
              enumerate(((E, D, F), (E, D, F), (E, F, D)), start=2)]
    sizes = jnp.asarray([3, 0, 5, 1], jnp.int32)  # an empty expert; 2 rows past the groups (another device's)
    x = _weights((11, D), 7)
    run = jax.jit(expert_mlp, static_argnames=("act", "implementation"))
    got = run(x, *stacks, sizes, act="silu", implementation=implementation)
    expected = run(x, *(dequantize_experts(q) for q in stacks), sizes, act="silu", implementation=implementation)
    # Scaling after the product (int8, fp8) rounds differently: float32 ulps of the largest outputs.
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6 * np.abs(expected).max())
    assert not np.any(got[9:])


def test_mxfp4_weights_quantize_back_to_themselves_as_the_checkpoint_reader_reads_them():
    """Experts dequantized from an MXFP4 checkpoint re-quantize exactly, to the reader's (transformers') values."""
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (E, F, D // 32, 16), dtype=np.uint8)  # [E, out, groups, 16] as stored
    scales = rng.integers(118, 134, (E, F, D // 32), dtype=np.uint8)
    stored = np.swapaxes(checkpoint_mxfp4.dequantize(blocks, scales), -1, -2)  # [E, in, out]
    q = quantize_experts(jnp.asarray(stored), "mxfp4", 32)
    assert q.values.dtype == q.scales.dtype == jnp.uint8 and q.shape == (E, D, F)
    np.testing.assert_array_equal(dequantize_experts(q), stored)


def test_row_experts_follow_the_group_sizes():
    np.testing.assert_array_equal(row_experts(jnp.asarray([2, 0, 3, 1]), 8), [0, 0, 2, 2, 2, 3, 3, 3])


def _layout(tp: int, ep: int) -> Layout:
    return Layout(AbstractMesh((1, ep, tp), ("dp", "ep", "tp")))


def test_quantized_experts_shard_as_the_weights_they_replace():
    down = quantize_experts(_weights((E, F, D), 8), "int8", 32)
    spec = experts_spec(down, ("experts", "mlp", "embed"), _layout(2, 2))
    assert spec.values == PartitionSpec("ep", "tp", None) and spec.scales == PartitionSpec("ep", None)
    int4 = quantize_experts(_weights((E, 128, D), 9), "int4", 32)  # 4 groups of hidden units: 2 per device
    spec = experts_spec(int4, ("experts", "mlp", "embed"), _layout(2, 2))
    assert spec.values == spec.scales == PartitionSpec("ep", "tp", None)
    assert isinstance(spec, QuantizedExperts) and spec.mode == "int4"


def test_int4_groups_that_would_split_over_devices_are_refused():
    down = quantize_experts(_weights((E, F, D), 10), "int4", 32)  # one group of 32 hidden units
    with pytest.raises(ValueError, match=r"layers.0.moe_down: int4 groups of 32 rows do not split evenly over 2 "
                                         r"devices \(32 input rows\); use a smaller quantization group or int8"):
        experts_spec(down, ("experts", "mlp", "embed"), _layout(2, 1), "layers.0.moe_down")
    assert experts_spec(down, ("experts", "mlp", "embed"), _layout(1, 2)).values == PartitionSpec("ep", None, None)


def test_bad_modes_and_groups_are_refused_by_name():
    with pytest.raises(ValueError, match="quantization='int3' is not accepted"):
        quantize_experts(_weights((E, D, F), 11), "int3", 32)
    with pytest.raises(ValueError, match="int4 group size 64 does not divide layers.1.moe_down's input size 32"):
        quantize_experts(_weights((E, 32, D), 12), "int4", 64, "layers.1.moe_down")


def _assert_trees_equal(a, b) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))


def test_weights_quantized_as_each_leaf_loads_equal_the_tree_quantized_after(checkpoint_dir):
    """The loader quantizes each leaf as it reads it (one float leaf held at a time): the same tree."""
    path = checkpoint_dir("mixtral")
    quantizer = leaf_quantizer(abstract_weights(load_config(path)), "int4")
    _, as_loaded = load_weights(path, jnp.float32, progress=False, transform=quantizer)
    _, plain = load_weights(path, jnp.float32, progress=False)
    assert isinstance(as_loaded.layers[0].moe_down, QuantizedExperts)
    _assert_trees_equal(as_loaded, quantize_weights(plain, "int4"))


def test_converts_with_float_experts_still_restore(checkpoint_dir, tmp_path):
    """A quantized convert written before experts were quantized (projections only) restores as stored."""
    path = checkpoint_dir("mixtral")
    _, plain = load_weights(path, jnp.float32, progress=False)
    projections_only = map_projections(plain, lambda w, c, name: quantize(w, c, "int8"))
    out = save_converted(projections_only, path, tmp_path / "converted")
    config = json.loads((out / "config.json").read_text())
    assert config[QUANT_KEY].pop("experts") is None
    (out / "config.json").write_text(json.dumps(config))  # the key older converts lack
    _assert_trees_equal(load_weights(out, jnp.float32)[1], projections_only)


def test_converts_that_marked_quantized_experts_true_restore(checkpoint_dir, tmp_path):
    """Converts of 2026-11-29 wrote "experts": true (the projections' mode); they restore as stored."""
    path = checkpoint_dir("mixtral")
    quantized = quantize_weights(load_weights(path, jnp.float32, progress=False)[1], "int4")
    out = save_converted(quantized, path, tmp_path / "converted")
    config = json.loads((out / "config.json").read_text())
    assert config[QUANT_KEY]["experts"] == {"mode": "int4", "group_size": 32}
    config[QUANT_KEY]["experts"] = True
    (out / "config.json").write_text(json.dumps(config))
    _assert_trees_equal(load_weights(out, jnp.float32)[1], quantized)


@pytest.mark.parametrize("mode", MODES)
def test_the_accelerators_paths_lower_for_cuda_and_tpu_without_host_round_trips(mode):
    """`ragged_dot` and the gathered products over the stored values (what GPUs and TPUs run) in bf16: no cond
    or while, and they export."""
    stacks = [quantize_experts(_weights(shape, seed), mode, 32) for seed, shape in
              enumerate(((E, D, F), (E, D, F), (E, F, D)))]
    x, sizes = _weights((8, D), 3).astype(jnp.bfloat16), jnp.asarray([3, 0, 5, 0], jnp.int32)
    for implementation in ("ragged_dot", "gathered"):
        program = jax.jit(functools.partial(expert_mlp, act="silu", implementation=implementation))
        assert not round_trips(program.trace(x, *stacks, sizes).jaxpr.jaxpr)
        for platform in ("cuda", "tpu"):
            text = export.export(program, platforms=(platform,))(x, *stacks, sizes).mlir_module()
            assert "stablehlo.while" not in text, (implementation, platform)
            assert ("ragged_dot" in text) == (implementation == "ragged_dot"), (implementation, platform)
