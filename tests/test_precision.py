"""float32 models ask every dot for HIGHEST precision; bf16 models keep XLA's default.

CPU computes float32 dots exactly whatever the flag says, so the check reads the lowered
program: a GPU compiling it would use TF32 for any dot_general without the flag.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from jaxinfer.cache.contiguous import init_cache
from jaxinfer.models import abstract_weights, forward, lm_logits
from jaxinfer.models.attention import dense_attention
from jaxinfer.models.layers import linear, linear_transposed
from jaxinfer.models.registry import load_config
from jaxinfer.parallel.array_info import is_info
from jaxinfer.quantization.quantized_weight import quantize, quantized_matmul

DOT = re.compile(r"stablehlo\.dot_general.*")
BATCH, TOKENS = 2, 24  # more than 16 queries: the dense XLA attention path, not a CPU kernel


def _dot_lines(fn, *args) -> list[str]:
    """The dot_general lines of jit(fn)(*args) lowered to StableHLO."""
    lines = DOT.findall(jax.jit(fn).lower(*args).as_text())
    assert lines, "no dot_general in the lowered program"
    return lines


def _abstract_model(model_dir, dtype):
    """(cfg, weights, cache) as ShapeDtypeStructs: lowering needs shapes, not values."""
    cfg = load_config(model_dir)
    as_struct = lambda info: jax.ShapeDtypeStruct(info.shape, dtype)  # noqa: E731
    weights = jax.tree.map(as_struct, abstract_weights(cfg), is_leaf=is_info)
    cache = jax.eval_shape(lambda: init_cache(cfg, BATCH, 32, dtype))
    return cfg, weights, cache


@pytest.mark.parametrize("arch", ["llama2", "qwen2"])  # untied and tied output heads
def test_float32_forward_lowers_every_dot_at_highest(checkpoint_dir, arch):
    cfg, weights, cache = _abstract_model(checkpoint_dir(arch), jnp.float32)
    tokens = jax.ShapeDtypeStruct((BATCH, TOKENS), jnp.int32)

    def run(weights, tokens, cache):
        positions = jnp.broadcast_to(jnp.arange(TOKENS), tokens.shape)
        hidden, _ = forward(weights, tokens, positions, cache, cfg)
        return lm_logits(weights, hidden)

    lines = _dot_lines(run, weights, tokens, cache)
    assert all("HIGHEST" in line for line in lines), [l for l in lines if "HIGHEST" not in l]
    # q, k, v, o, gate, up, down in the layer function (all layers share one, models.layer_calls); the head
    assert len(lines) >= 7 + 1


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_keeps_default_precision(dtype):
    x, w = jnp.ones((4, 8), dtype), jnp.ones((8, 16), dtype)
    assert not any("HIGHEST" in line for line in _dot_lines(linear, x, w))
    assert not any("HIGHEST" in line for line in _dot_lines(linear_transposed, x, w.T))


def test_dense_attention_float32_is_highest():
    q = jnp.ones((1, 3, 4, 8), jnp.float32)
    k = jnp.ones((1, 2, 5, 8), jnp.float32)
    v = jnp.ones((1, 2, 8, 5), jnp.float32)
    mask = jnp.ones((1, 3, 5), bool)
    lines = _dot_lines(dense_attention, q, k, v, mask)
    assert len(lines) == 2 and all("HIGHEST" in line for line in lines)


@pytest.mark.parametrize("mode", ["int8", "int4", "fp8"])
def test_float32_quantized_matmul_is_highest(mode):
    """The XLA path of a quantized weight (GPU/TPU, or CPU without kernels) keeps float32 exact too."""
    w = quantize(jax.random.normal(jax.random.key(0), (64, 16)), 1, mode, 32)
    x = jnp.ones((3, 64), jnp.float32)
    lines = _dot_lines(quantized_matmul, x, w)
    assert all("HIGHEST" in line for line in lines), [line for line in lines if "HIGHEST" not in line]
