"""Joined q/k/v and gate/up projections: one product equals the separate ones, and splitting gives the parts back."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.models import join_projections, split_projections
from jaxinfer.models.joined_weight import JoinedWeight, join, joinable, split
from jaxinfer.models.layers import linear, linears
from jaxinfer.quantization.quantized_weight import QuantizedWeight, for_gpu_kernel, quantize, tile

D, H, KV, K = 64, 4, 2, 16  # input size, query heads, kv heads, head size


def qkv_weights(dtype=jnp.float32) -> list[jax.Array]:
    keys = jax.random.split(jax.random.key(0), 3)
    shapes = [(D, H, K), (D, KV, K), (D, KV, K)]
    return [jax.random.normal(key, shape, dtype) / 8 for key, shape in zip(keys, shapes)]


def parts_of(mode: str | None) -> list:
    ws = qkv_weights()
    return ws if mode is None else [quantize(w, 1, mode, 32) for w in ws]


@pytest.mark.parametrize("mode", [None, "int8", "int4", "fp8"])
def test_split_gives_the_parts_back(mode: str | None) -> None:
    parts = parts_of(mode)
    joined = join(parts)
    assert joined.shapes == tuple(p.shape for p in parts)
    for original, back in zip(parts, split(joined)):
        if mode is None:
            np.testing.assert_array_equal(back, original)
        else:
            assert back.shape == original.shape and back.mode == original.mode and back.group == original.group
            np.testing.assert_array_equal(back.values, original.values)
            np.testing.assert_array_equal(back.scales, original.scales)


@pytest.mark.parametrize("mode", [None, "int8", "int4", "fp8"])
def test_one_joined_product_equals_the_separate_ones(mode: str | None) -> None:
    parts = parts_of(mode)
    x = jax.random.normal(jax.random.key(1), (3, 5, D), jnp.float32)
    separate = [linear(x, w) for w in parts]
    joined = linears(x, [join(parts), None, None])
    for a, b in zip(joined, separate):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_only_alike_plain_or_rows_layout_weights_join() -> None:
    ws = qkv_weights()
    q8 = [quantize(w, 1, "int8") for w in ws]
    assert joinable(ws) and joinable(q8)
    assert not joinable([ws[0], ws[1].astype(jnp.bfloat16)])  # dtypes differ
    assert not joinable([ws[0], q8[1]])  # plain beside quantized
    assert not joinable([q8[0], quantize(ws[1], 1, "int4", 32)])  # modes differ
    assert not joinable([tile(q) for q in q8])  # the CPU kernel's tiles share a call already
    marked = for_gpu_kernel(quantize(jnp.ones((256, 64)), 1, "int8"))
    assert marked.gpu_kernel and not joinable([marked, marked])  # marks are given after joining


def test_a_joined_weight_stands_for_all_its_parts() -> None:
    parts = qkv_weights()
    x = jnp.ones((2, D))
    with pytest.raises(ValueError, match="the others must be None"):
        linears(x, [join(parts), parts[1], None])
    with pytest.raises(ValueError, match="the others must be None"):
        linears(x, [join(parts), None])


def test_release_frees_the_parts() -> None:
    parts = [w + 0 for w in qkv_weights()]
    joined = join(parts, release=True)
    assert all(p.is_deleted() for p in parts) and not joined.weight.is_deleted()


@pytest.mark.parametrize("quantization", [None, "int8", "int4"])
def test_models_run_joined_off_the_cpu_kernels_and_give_the_same_tokens(quantization: str | None) -> None:
    """cpu_kernels=False (XLA's dots, the accelerators' path): q/k/v and gate/up run joined, the
    model's tree splits back, and greedy tokens equal those of the split tree run as it is."""
    llm = LLM(dtype="bfloat16", max_seq_len=96, cpu_kernels=False, quantization=quantization, max_num_seqs=2)
    run = llm._run_weights.layers[0]
    assert isinstance(run.wq, JoinedWeight) and run.wk is None and run.wv is None
    assert isinstance(run.w_gate, JoinedWeight) and run.w_up is None
    model = llm.weights.layers[0]
    assert not isinstance(model.wq, JoinedWeight) and model.wk.shape == model.wv.shape
    assert isinstance(model.wk, QuantizedWeight) == (quantization is not None)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompts = ["Once upon a time", "The little dog"]
    joined = [o.token_ids for o in llm.generate(prompts, params)]
    llm._run_weights = split_projections(llm._run_weights)
    assert not isinstance(llm._run_weights.layers[0].wq, JoinedWeight)
    assert [o.token_ids for o in llm.generate(prompts, params)] == joined


def test_join_projections_leaves_packed_cpu_weights_alone() -> None:
    llm = LLM(dtype="bfloat16", max_seq_len=64)
    if not llm.cpu_kernels:
        pytest.skip("the CPU kernels do not build here (no compiler)")
    before = llm._run_weights.layers[0]
    after = join_projections(llm._run_weights).layers[0]
    assert all(getattr(after, name) is getattr(before, name) for name in ("wq", "wk", "wv", "w_gate", "w_up"))
