"""The packed bf16 matmul CPU kernel against numpy on fresh random inputs."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from python_subprocess import needs_compiler, on_cpu_backend, run_python

from jaxinfer import LLM
from jaxinfer.kernels.cpu import (
    PackedWeight,
    kernels_available,
    pack_weight,
    packed_matmul,
    unpack_weight,
)
from jaxinfer.models.joined_weight import JoinedWeight
from jaxinfer.models.layers import linear, linears
from jaxinfer.models.row_table import RowTable, full_table

pytestmark = [on_cpu_backend, needs_compiler]

# Odd K (a zero-padded pair), N short of a tile or just past one, and a full-size projection.
SHAPES = [(1, 1), (3, 17), (577, 33), (130, 1539), (576, 192)]
ROWS = [1, 3, 8, 9, 40]


@pytest.fixture(scope="module", autouse=True)
def kernel_built() -> None:
    assert kernels_available(), "the CPU kernels did not build (see the log)"


def random_bf16(rng: np.random.Generator, shape: tuple[int, ...]) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)


def exact_product(x: jax.Array, w: np.ndarray) -> np.ndarray:
    """x @ w in float64 from the bf16 values: the kernel differs only by f32 summation order."""
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64)


def assert_close(got: jax.Array, expected: np.ndarray, k: int) -> None:
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5 * math.sqrt(k))


@pytest.mark.parametrize("shape,contract", [((5, 7), 1), ((577, 33), 1), ((64, 3, 8), 1), ((3, 8, 40), 2)])
def test_pack_then_unpack_is_identity(shape: tuple[int, ...], contract: int) -> None:
    w = random_bf16(np.random.default_rng(len(shape)), shape)
    packed = pack_weight(w, contract)
    k, n = math.prod(shape[:contract]), math.prod(shape[contract:])
    assert packed.data.shape == (-(-n // 32), -(-k // 2), 64)
    np.testing.assert_array_equal(np.asarray(unpack_weight(packed)), np.asarray(w))


@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("rows", ROWS)
def test_packed_matmul_matches_exact_product(k: int, n: int, rows: int) -> None:
    rng = np.random.default_rng(k * 7919 + n * 31 + rows)
    w, x = random_bf16(rng, (k, n)), random_bf16(rng, (rows, k))
    got = jax.jit(packed_matmul)(x, pack_weight(w))
    assert got.shape == (rows, n) and got.dtype == jnp.float32
    assert_close(got, exact_product(x, np.asarray(w)), k)


@pytest.mark.parametrize("rows", [1, 5, 40])
def test_linear_with_packed_weight_matches_dense(rows: int) -> None:
    rng = np.random.default_rng(rows)
    x = random_bf16(rng, (rows, 1, 4, 16))
    w = random_bf16(rng, (4, 16, 96))
    dense = jax.jit(lambda x, w: linear(x, w, contract=2, out_dtype=jnp.float32))(x, w)
    packed = jax.jit(lambda x, w: linear(x, w, contract=2, out_dtype=jnp.float32))(x, pack_weight(w, 2))
    assert packed.shape == (rows, 1, 96)
    np.testing.assert_allclose(np.asarray(packed), np.asarray(dense), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 9])
def test_linears_share_one_call_and_match_one_call_each(rows: int) -> None:
    """q/k/v-like weights (different N, tiles split across tasks) in one kernel call: the same products."""
    rng = np.random.default_rng(rows)
    ws = [pack_weight(random_bf16(rng, (96, n))) for n in (96, 32, 33)]
    x = random_bf16(rng, (2, rows, 96))
    joint = jax.jit(linears)(x, ws)
    for y, w in zip(joint, ws):
        assert y.shape == (2, rows, w.out_size)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(linear(x, w)))
    hlo = jax.jit(linears).lower(x, ws).as_text()
    assert hlo.count("jaxinfer_packed_matmul") == 1
    dense = [unpack_weight(ws[0]), ws[1]]  # not all packed: one linear each
    for y, w in zip(linears(x, dense), dense):
        np.testing.assert_array_equal(np.asarray(y), np.asarray(linear(x, w)))


def test_linear_rejects_a_weight_packed_for_another_contraction() -> None:
    w = pack_weight(jnp.ones((4, 16, 8), jnp.bfloat16), contract=1)
    with pytest.raises(ValueError, match="stored with contract=1, used with contract=2"):
        linear(jnp.ones((1, 4, 16), jnp.bfloat16), w, contract=2)


def test_only_bf16_models_run_packed_and_users_see_the_models_weights() -> None:
    bf16 = LLM(dtype="bfloat16", max_seq_len=64)
    assert bf16.cpu_kernels
    assert all(isinstance(lw.w_down, PackedWeight) for lw in bf16._run_weights.layers)
    # The demo model ties its head to the embedding: the running tree has a packed copy of embed.T,
    # and the embedding's bits for the lookup.
    assert bf16.config.tie_word_embeddings
    run = bf16._run_weights
    assert isinstance(run.embed, RowTable) and run.embed.bits.dtype == jnp.uint16
    np.testing.assert_array_equal(np.asarray(unpack_weight(run.lm_head)), np.asarray(bf16.weights.embed.T))
    np.testing.assert_array_equal(np.asarray(full_table(run.embed)), np.asarray(bf16.weights.embed))
    # What the user sees is the model's pytree: plain arrays, no extra head.
    assert not any(isinstance(leaf, PackedWeight) for leaf in jax.tree.leaves(
        bf16.weights, is_leaf=lambda x: isinstance(x, PackedWeight)))
    assert bf16.weights.lm_head is None
    np.testing.assert_array_equal(np.asarray(bf16.weights.layers[0].wo), np.asarray(unpack_weight(run.layers[0].wo)))
    f32 = LLM(dtype="float32", max_seq_len=64)
    assert not isinstance(f32._run_weights.layers[0].w_down, PackedWeight) and f32._run_weights.lm_head is None


PORTABLE_SCRIPT = """
import os
import jax, jax.numpy as jnp, numpy as np
from jaxinfer.quantization import quantized_weight
from jaxinfer.kernels.cpu import pack_weight, packed_matmul
from jaxinfer.kernels.cpu.build import load
from jaxinfer.kernels.cpu.packed_matmul import TARGET
from jaxinfer.kernels.cpu.packed_quant import INT4_TARGET, INT8_TARGET
flags = tuple(os.environ["KERNEL_FLAGS"].split())
for symbol, target in (("JaxinferPackedMatmul", TARGET), ("JaxinferInt8Matmul", INT8_TARGET), ("JaxinferInt4Matmul", INT4_TARGET)):
    assert load("packed_matmul.cc", symbol, target, extra_flags=flags)
rng = np.random.default_rng(0)
w = jnp.asarray(rng.standard_normal((128, 70)), jnp.bfloat16)
for rows in (1, 2, 9):
    x = jnp.asarray(rng.standard_normal((rows, 128)), jnp.bfloat16)
    exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    np.testing.assert_allclose(np.asarray(packed_matmul(x, pack_weight(w))), exact, rtol=1e-5, atol=1e-4)
    for mode in ("int8", "int4"):
        q = quantized_weight.quantize(w, 1, mode)
        want = np.asarray(x, np.float64) @ np.asarray(quantized_weight.dequantize(q), np.float64)
        got = quantized_weight.quantized_matmul(x, quantized_weight.tile(q))
        # within the kernel's int16 rounding of each activation row (see test_quantization.py)
        xa, wa = np.abs(np.asarray(x, np.float64)), np.abs(np.asarray(quantized_weight.dequantize(q), np.float64))
        bound = 0.5 * xa.max(axis=1, keepdims=True) / 32767 * wa.sum(axis=0) + 1e-6 * (xa @ wa)
        assert (np.abs(np.asarray(got) - want) <= bound).all(), (mode, rows)
print("ok")
"""


@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx2",)], ids=["avx2", "portable"])
def test_loops_for_cpus_without_avx512(tmp_path, flags: tuple[str, ...]) -> None:
    """The AVX2 tiles and the portable loops (built here with those flags) give the same products."""
    assert run_python(PORTABLE_SCRIPT, JAXINFER_CACHE_DIR=str(tmp_path), KERNEL_FLAGS=" ".join(flags)) == "ok"
    (library,) = (tmp_path / "cpu_kernels").glob("packed_matmul-*.so")  # one library, built with the flags


def test_kernels_off_keep_weights_unpacked() -> None:
    """cpu_kernels=False: bf16 weights stay dense (q/k/v and gate/up joined) and every product runs through XLA's dot."""
    llm = LLM(dtype="bfloat16", max_seq_len=64, cpu_kernels=False)
    run = llm._run_weights.layers[0]
    assert not llm.cpu_kernels and not isinstance(run.w_down, PackedWeight)
    assert isinstance(run.wq, JoinedWeight) and isinstance(run.wq.weight, jax.Array) and run.wk is None


def test_environment_overrides_only_the_automatic_choice() -> None:
    script = (
        "from jaxinfer import LLM\n"
        "print(LLM(dtype='bfloat16', max_seq_len=64).cpu_kernels,"
        " LLM(dtype='bfloat16', max_seq_len=64, cpu_kernels=True).cpu_kernels)\n"
    )
    assert run_python(script, kernels=False) == "False True"
