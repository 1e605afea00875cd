"""The native CPU bf16 GEMV against a float32 jnp product on fresh random inputs."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.cpu_kernels import bf16_gemv, gemv_applies
from jaxinfer.cpu_kernels.build import load
from jaxinfer.layers import linear, linear_transposed

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="CPU-only kernel")


@pytest.fixture(scope="module", autouse=True)
def kernel_built() -> None:
    assert load("gemv.cc", "JaxinferBf16Gemv", "jaxinfer_bf16_gemv"), "g++ could not build gemv.cc"


# Odd sizes cover the 4-row tail, partial column blocks and chunks smaller than a block.
SHAPES = [(1, 1), (3, 17), (576, 192), (577, 1539), (130, 4099)]


@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("transposed", [False, True])
def test_gemv_matches_float32_product(k: int, n: int, transposed: bool) -> None:
    rng = np.random.default_rng(k * 7919 + n)
    w = jnp.asarray(rng.standard_normal((n, k) if transposed else (k, n)), jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal(k), jnp.float32)
    w32 = np.asarray(w.astype(jnp.float32))
    expected = np.asarray(x) @ (w32.T if transposed else w32)
    got = jax.jit(bf16_gemv, static_argnames="transposed")(x, w, transposed=transposed)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-4 * np.sqrt(k))


def test_linear_uses_kernel_only_for_one_bf16_row() -> None:
    w = jnp.ones((8, 32), jnp.bfloat16)
    assert gemv_applies(1, w)
    assert not gemv_applies(2, w)
    assert not gemv_applies(1, w.astype(jnp.float32))


@pytest.mark.parametrize("rows", [1, 3])
def test_linear_paths_agree(rows: int) -> None:
    """One row (kernel) and several rows (XLA dot) give the same per-row results."""
    rng = np.random.default_rng(rows)
    x = jnp.asarray(rng.standard_normal((rows, 1, 4, 16)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((4, 16, 96)), jnp.bfloat16)
    head = jnp.asarray(rng.standard_normal((300, 64)), jnp.bfloat16)
    expected = np.einsum("bthk,hkd->btd", np.asarray(x, np.float32), np.asarray(w, np.float32))
    got = jax.jit(lambda x, w: linear(x, w, contract=2, out_dtype=jnp.float32))(x, w)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-3)
    flat = x.reshape(rows, 64)
    logits = jax.jit(linear_transposed)(flat, head)
    expected_logits = np.asarray(flat, np.float32) @ np.asarray(head, np.float32).T
    np.testing.assert_allclose(np.asarray(logits), expected_logits, rtol=1e-4, atol=1e-3)


def test_disabled_kernels_fall_back_to_xla() -> None:
    """With JAXINFER_CPU_KERNELS=0 the same one-row product runs through XLA's dot."""
    script = (
        "import jax.numpy as jnp, numpy as np\n"
        "from jaxinfer.cpu_kernels import gemv_applies\n"
        "from jaxinfer.layers import linear\n"
        "w = jnp.asarray(np.arange(12.0).reshape(3, 4), jnp.bfloat16)\n"
        "assert not gemv_applies(1, w)\n"
        "print(np.asarray(linear(jnp.ones((1, 3), jnp.bfloat16), w, out_dtype=jnp.float32)).tolist())\n"
    )
    env = {**os.environ, "JAXINFER_CPU_KERNELS": "0"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[[12.0, 15.0, 18.0, 21.0]]"
