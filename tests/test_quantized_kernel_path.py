"""The Triton quantized matmul on the model path (interpret mode on CPU): which leaves it takes,
the same products as the XLA path, and the same greedy tokens through `LLM(quantized_kernel=True)`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.models.llama import PROJECTIONS
from jaxinfer.quantization.quantized_weight import (
    KERNEL_ROWS,
    for_gpu_kernel,
    gpu_kernel_fits,
    quantize,
    quantized_matmul,
    tile,
)

PROMPTS = ["def parse(line):\n", "class Stack:\n", "import os\n"]
PARAMS = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def _weight(k: int, n: int, mode: str, seed: int = 0):
    w = jax.random.normal(jax.random.key(seed), (k, n), jnp.float32) / k**0.5
    return quantize(w, 1, mode, 32)


@pytest.mark.parametrize("mode,k,n,fits", [
    ("int8", 256, 768, True), ("int4", 512, 96, True), ("int8", 768, 256, False),  # input not a power of two
    ("int8", 256, 100, False), ("fp8", 256, 256, False),  # columns not in 16s; no fp8 kernel
])
def test_kernel_takes_power_of_two_inputs_and_columns_in_sixteens(mode, k, n, fits):
    q = _weight(k, n, mode)
    assert gpu_kernel_fits(q) == fits
    assert for_gpu_kernel(q).gpu_kernel == fits
    if mode != "fp8":
        assert not gpu_kernel_fits(tile(q))  # the CPU layout is the CPU kernel's


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 5, KERNEL_ROWS, KERNEL_ROWS + 1])
def test_marked_weight_gives_the_xla_product(mode, rows):
    """Decode rows through the kernel match the XLA dot up to float32 summation order; longer
    inputs (prefill) and float32 ones take the XLA dot itself."""
    q = _weight(256, 384, mode, rows)
    marked = for_gpu_kernel(q, interpret=True)
    x = jax.random.normal(jax.random.key(rows), (rows, 256), jnp.bfloat16)
    got, want = quantized_matmul(x, marked), quantized_matmul(x, q)
    if rows > KERNEL_ROWS:
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    else:
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
    x32 = x.astype(jnp.float32)
    np.testing.assert_array_equal(np.asarray(quantized_matmul(x32, marked)), np.asarray(quantized_matmul(x32, q)))


# int4 through a whole model on a GPU only: in interpret mode on CPU it adds ~18 s of compiles to
# what the product test above already covers.
ON_CPU = jax.default_backend() == "cpu"


@pytest.mark.parametrize("mode", ["int8", pytest.param("int4", marks=pytest.mark.skipif(
    ON_CPU, reason="int4 kernel products are checked above; the whole-model run is for GPUs"))])
def test_llm_with_the_kernel_generates_the_xla_tokens(mode):
    def run(kernel: bool) -> tuple[LLM, list[list[int]]]:
        llm = LLM(dtype="bfloat16", max_seq_len=128, quantization=mode, cpu_kernels=False,
                  quantized_kernel=kernel, interpret_kernels=kernel)
        return llm, [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]

    llm, tokens = run(True)
    marked = [getattr(llm.weights.layers[0], name).gpu_kernel for name in PROJECTIONS]
    assert any(marked) and not all(marked)  # the demo's MLP input (768) is not a power of two
    assert tokens == run(False)[1]


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the refusal where there is no GPU")
def test_kernel_without_a_gpu_is_refused_naming_the_knob():
    with pytest.raises(ValueError, match="quantized_kernel=True needs a GPU"):
        LLM(dtype="bfloat16", max_seq_len=64, quantization="int8", cpu_kernels=False, quantized_kernel=True)
