"""Weight-only int8/int4 and bf16 Triton decode matmuls (interpret mode on CPU) vs the float64
product of the (dequantized) weight; lowering to Triton checked from any host."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from paged_kernel_inputs import lower_for, require_device

from jaxinfer.quantization import quantized_weight
from pallas_kernels.quant_matmul_gpu import (
    DEFAULT_NUM_CORES,
    Tiling,
    bf16_matmul_gpu,
    choose_quantized_tiling,
    choose_tiling,
    int4_matmul_gpu,
    int8_matmul_gpu,
)


def _weight(k: int, n: int, mode: str, group: int, seed: int) -> quantized_weight.QuantizedWeight:
    w = jax.random.normal(jax.random.key(seed), (k, n), jnp.float32) / k**0.5
    return quantized_weight.quantize(w, 1, mode, group)


def _run(x: jax.Array, q: quantized_weight.QuantizedWeight, tiling: Tiling | None, interpret: bool = True) -> jax.Array:
    if q.mode == "int4":
        return int4_matmul_gpu(x, q.values, q.scales, q.group, tiling, interpret)
    return int8_matmul_gpu(x, q.values, q.scales, tiling, interpret)


def _assert_exact_up_to_float32_sums(got: jax.Array, x: jax.Array, q: quantized_weight.QuantizedWeight) -> None:
    """bf16 activations times int8/int4 values are exact in float32; only the sums round."""
    xs = np.asarray(x.astype(jnp.bfloat16), np.float64)
    w = np.asarray(quantized_weight.dequantize(q), np.float64)
    bound = 1e-5 * (np.abs(xs) @ np.abs(w)) + 1e-7
    assert got.shape == (x.shape[0], w.shape[1]) and got.dtype == jnp.float32
    assert (np.abs(np.asarray(got, np.float64) - xs @ w) <= bound).all()


# (K, N, rows, tiling): one split and several (the partial sums), columns in blocks of 64 and 128.
CASES = [
    (256, 128, 1, None),
    (576, 192, 3, None),
    (512, 256, 16, Tiling(block_n=64, block_k=64, splits=4)),
    (512, 256, 5, Tiling(block_n=128, block_k=128, splits=1)),
]


@pytest.mark.parametrize("k,n,rows,tiling", CASES)
def test_int8_matches_the_float64_product(k, n, rows, tiling):
    q = _weight(k, n, "int8", 0, k + rows)
    x = jax.random.normal(jax.random.key(rows), (rows, k), jnp.float32) * 3
    _assert_exact_up_to_float32_sums(_run(x, q, tiling), x, q)


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("k,n,rows,splits", [(256, 128, 1, 1), (512, 192, 7, 2)])
def test_int4_matches_the_float64_product(group, k, n, rows, splits):
    q = _weight(k, n, "int4", group, group + rows)
    x = jax.random.normal(jax.random.key(group), (rows, k), jnp.float32)
    tiling = Tiling(block_n=64, block_k=group, splits=splits)
    _assert_exact_up_to_float32_sums(_run(x, q, tiling), x, q)


def _bf16_weight(k: int, n: int, seed: int) -> jax.Array:
    return (jax.random.normal(jax.random.key(seed), (k, n), jnp.float32) / k**0.5).astype(jnp.bfloat16)


def _assert_bf16_product(got: jax.Array, x: jax.Array, w: jax.Array) -> None:
    """bf16 x bf16 products are exact in float32; only the sums round."""
    xs, ws = np.asarray(x.astype(jnp.bfloat16), np.float64), np.asarray(w, np.float64)
    assert got.shape == (x.shape[0], w.shape[1]) and got.dtype == jnp.float32
    assert (np.abs(np.asarray(got, np.float64) - xs @ ws) <= 1e-5 * (np.abs(xs) @ np.abs(ws)) + 1e-7).all()


@pytest.mark.parametrize("k,n,rows,tiling", CASES)
def test_bf16_matches_the_float64_product(k, n, rows, tiling):
    w = _bf16_weight(k, n, k + n)
    x = jax.random.normal(jax.random.key(rows + 7), (rows, k), jnp.float32)
    tiling = tiling and dataclasses.replace(tiling, block_k=min(tiling.block_k, 64))
    _assert_bf16_product(bf16_matmul_gpu(x, w, tiling, interpret=True), x, w)


def test_bad_shapes_are_refused_with_what_is_accepted():
    q = _weight(256, 128, "int8", 0, 1)
    with pytest.raises(ValueError, match="up to 16 rows"):
        _run(jnp.ones((17, 256)), q, None)
    with pytest.raises(ValueError, match="does not divide"):
        _run(jnp.ones((1, 256)), q, Tiling(block_n=128, block_k=128, splits=4))


@pytest.mark.parametrize("k,n", [(2048, 2048), (2048, 512), (2048, 8192), (8192, 2048), (576, 1536)])
def test_chosen_tiling_divides_and_fills_the_gpu(k, n):
    """Llama-3.2-1B's projections (and a SmolLM one): blocks dividing; bf16 about two programs a
    core, int8/int4 up to eight in columns of 64 and at most 16 K splits."""
    for step_rows in (128, 32):
        rows = step_rows if k % step_rows == 0 else 64
        tilings = ((choose_tiling(k, n, rows), 2, k // rows), (choose_quantized_tiling(k, n, rows), 8, 16))
        for t, per_core, most in tilings:
            assert n % t.block_n == 0 and (k // t.block_k) % t.splits == 0 and t.splits <= most
            if k >= 2048:
                assert (n // t.block_n) * t.splits >= per_core * DEFAULT_NUM_CORES or t.splits in (k // t.block_k, most)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_kernels_lower_to_triton(mode):
    """The kernels lower for CUDA (Triton) from any host, at a Llama-3.2-1B projection's shape."""
    q = _weight(2048, 2048, mode, 32, 3)
    x = jnp.ones((1, 2048), jnp.bfloat16)
    run = lambda x, values, scales: _run(x, dataclasses.replace(q, values=values, scales=scales), None, False)  # noqa: E731
    lowered = lower_for("cuda", run, x, q.values, q.scales)
    assert "xla.gpu.triton" in lowered and f'name = "{mode}_matmul_gpu"' in lowered


def test_bf16_kernel_lowers_to_triton():
    lowered = lower_for("cuda", bf16_matmul_gpu, jnp.ones((1, 2048), jnp.bfloat16), _bf16_weight(2048, 8192, 3))
    assert "xla.gpu.triton" in lowered and 'name = "bf16_matmul_gpu"' in lowered


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_on_gpu_matches_xla(mode):
    require_device("gpu")
    q = _weight(2048, 8192, mode, 32, 4)
    x = jax.random.normal(jax.random.key(5), (4, 2048), jnp.float32)
    _assert_exact_up_to_float32_sums(_run(x, q, None, interpret=False), x, q)


def test_bf16_on_gpu_matches_xla():
    require_device("gpu")
    w = _bf16_weight(8192, 2048, 6)
    x = jax.random.normal(jax.random.key(8), (3, 8192), jnp.float32)
    _assert_bf16_product(bf16_matmul_gpu(x, w), x, w)
