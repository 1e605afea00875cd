"""Weight quantization: leaf math, the CPU kernel against the XLA path, accuracy gates, memory, load and convert."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.checkpoint.converted import save_converted
from jaxinfer.checkpoint.loader import load_weights
from jaxinfer.entrypoints.cli import main as cli_main
from jaxinfer.entrypoints.llm import DEMO_MODEL
from jaxinfer.kernels.cpu import kernels_available
from jaxinfer.models import pack_for_cpu, quantize_head, quantize_weights
from jaxinfer.models.layers import linear, linears
from jaxinfer.models.llama import PROJECTIONS
from jaxinfer.parallel.array_info import tree_bytes
from jaxinfer.parallel.sharding import UNSHARDED
from jaxinfer.quantization.quantized_weight import QuantizedWeight, dequantize, quantize, quantized_matmul, tile, untile
from jaxinfer.runtime.prompt_logprobs import all_position_logits

WINDOW, WINDOWS = 256, 8  # 2048 held-out positions scored
GATES = {"int8": (0.99, 0.01), "int4": (0.95, 0.05)}  # top-1 agreement >=, perplexity increase <=
HEAD_MODES = ("int8+head", "int4+head")  # quantize_lm_head=True: the same gates
HELD_OUT = Path(__file__).parent / "data" / "demo_held_out_windows.json"
needs_kernels = pytest.mark.skipif(not kernels_available(), reason="CPU kernels unavailable")


def held_out_windows() -> list[list[int]]:
    """Token windows of stdlib files the demo model never trained on (its model card lists them), stored:
    read from the running Python's stdlib they changed with its version (3.12 has no distutils)."""
    windows = json.loads(HELD_OUT.read_text())["windows"]
    assert len(windows) == WINDOWS and all(len(w) == WINDOW for w in windows)
    return windows


@pytest.fixture(scope="module")
def scored() -> dict:
    """Per mode: logits over the held-out windows (float32 model; quantized ones through the CPU kernel if on)."""
    cfg, weights = load_weights(DEMO_MODEL, jnp.float32)
    windows = held_out_windows()
    out = {"windows": windows}
    for mode in (None, "int8", "int4", *HEAD_MODES):
        run = quantize_weights(weights, mode and mode.removesuffix("+head"), 32)
        if mode in HEAD_MODES:
            run = quantize_head(run, mode.removesuffix("+head"), 32, UNSHARDED)
        run = pack_for_cpu(run) if kernels_available() else run
        out[mode] = [all_position_logits(run, cfg, w, jnp.float32, WINDOW) for w in windows]
    return out


def projections(weights) -> list:
    """The quantizable projection leaves of every layer."""
    return [getattr(lw, name) for lw in weights.layers for name in PROJECTIONS]


def perplexity(logits: list[np.ndarray], windows: list[list[int]]) -> float:
    """exp of the mean next-token negative log-likelihood over the windows."""
    nll = []
    for lg, ids in zip(logits, windows):
        logp = jax.nn.log_softmax(jnp.asarray(lg[:-1]), axis=-1)
        nll.append(-np.asarray(logp)[np.arange(len(ids) - 1), ids[1:]])
    return float(np.exp(np.mean(np.concatenate(nll))))


@pytest.mark.parametrize("mode", ["int8", "int4", *HEAD_MODES])
def test_accuracy_gates_on_held_out_text(scored, mode):
    min_agree, max_ppl_increase = GATES[mode.removesuffix("+head")]
    agree = np.mean(np.concatenate([a.argmax(-1) == b.argmax(-1) for a, b in zip(scored[None], scored[mode])]))
    base, quant = perplexity(scored[None], scored["windows"]), perplexity(scored[mode], scored["windows"])
    assert agree >= min_agree, (mode, agree)
    assert quant / base - 1 <= max_ppl_increase, (mode, base, quant)


@pytest.mark.parametrize("mode,limit", [("int8", 0.52), ("int4", 0.30)])
def test_weight_memory_of_quantized_layers(mode, limit):
    _, bf16 = load_weights(DEMO_MODEL, jnp.bfloat16)
    quant = quantize_weights(bf16, mode, 32)
    tiled = pack_for_cpu(quant) if kernels_available() else quant  # the layout that runs (padded to tiles)
    for tree in (quant, tiled):
        assert tree_bytes(projections(tree)) <= limit * tree_bytes(projections(bf16))


@pytest.mark.parametrize("mode,tolerance", [("int8", 0.005), ("int4", 0.08), ("fp8", 0.07)])
def test_dequantized_weight_is_close(mode, tolerance):
    w = jax.random.normal(jax.random.key(0), (128, 4, 16), jnp.float32)
    q = quantize(w, 1, mode, 32)
    assert isinstance(q, QuantizedWeight) and q.out_size == 64 and q.in_size == 128
    err = jnp.abs(dequantize(q) - w) / jnp.max(jnp.abs(w), axis=0)
    assert float(err.max()) <= tolerance


@pytest.mark.parametrize("mode,k", [("int8", 130), ("int8", 64), ("int4", 128)])
def test_tile_then_untile_is_identity(mode, k):
    """The kernel layouts (odd pairs padded, N short of a tile) give the rows layout back exactly."""
    q = quantize(jax.random.normal(jax.random.key(6), (k, 33), jnp.float32), 1, mode, 32)
    back = untile(tile(q))
    np.testing.assert_array_equal(np.asarray(back.values), np.asarray(q.values))
    np.testing.assert_array_equal(np.asarray(back.scales), np.asarray(q.scales))


def int16_rounding_bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Largest |error| [M, N] of x @ w once each row of x is rounded to int16 with its own scale.

    Half a step (max|x_row| / 32767 / 2) per activation times sum_k |w[k, n]|, plus float32
    rounding of the sums and scales.
    """
    step = np.abs(x).max(axis=1, keepdims=True) / 32767
    return 0.5 * step * np.abs(w).sum(axis=0) + 1e-6 * (np.abs(x) @ np.abs(w))


@needs_kernels
@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 2, 5, 11])
def test_cpu_kernel_matches_xla_path(mode, rows):
    w = jax.random.normal(jax.random.key(1), (4, 32, 70), jnp.float32)  # contract 2, N not a tile multiple
    q = quantize(w, 2, mode, 64)
    x = jax.random.normal(jax.random.key(2), (rows, 128), jnp.float32) * jnp.arange(1, rows + 1)[:, None]
    w2 = np.asarray(dequantize(q), np.float64).reshape(128, 70)
    reference = np.asarray(x, np.float64) @ w2
    np.testing.assert_allclose(quantized_matmul(x, q), reference, rtol=1e-5, atol=1e-4)
    # The kernel rounds activations to int16 per row: within that rounding of the exact product.
    error = np.abs(np.asarray(quantized_matmul(x, tile(q)), np.float64) - reference)
    assert (error <= int16_rounding_bound(np.asarray(x, np.float64), w2)).all(), error.max()


@needs_kernels
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_cpu_kernel_rows_are_independent(mode):
    """A row's scale is its own: a huge row, a zero row, a NaN row or an infinite one leaves the others'
    products alone (the last two are NaN throughout)."""
    w = jax.random.normal(jax.random.key(3), (96, 40), jnp.float32)
    q = tile(quantize(w, 1, mode, 32))
    x = jax.random.normal(jax.random.key(4), (5, 96), jnp.float32)
    alone = np.asarray(quantized_matmul(x[:1], q))
    mixed = x.at[1].multiply(1e6).at[2].set(0.0).at[3, 5].set(jnp.nan).at[4, 90].set(-jnp.inf)
    got = np.asarray(quantized_matmul(mixed, q))
    np.testing.assert_array_equal(got[0], alone[0])
    assert (got[2] == 0).all() and np.isnan(got[3:]).all() and np.isfinite(got[1]).all()


@needs_kernels
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_cpu_kernel_rows_match_alone_in_any_batch(mode):
    """Each row's product is the same bits alone and in a batch of 11 (passes of 8 + 3 rows for int8,
    4 + 4 + 3 for int4; two chunks of int8 pairs): the engine's batch invariance with quantized weights."""
    w = jax.random.normal(jax.random.key(6), (320, 72), jnp.float32)
    q = tile(quantize(w, 1, mode, 32))
    x = jax.random.normal(jax.random.key(7), (11, 320), jnp.float32)
    batch = np.asarray(quantized_matmul(x, q))
    for r in range(11):
        np.testing.assert_array_equal(batch[r], np.asarray(quantized_matmul(x[r : r + 1], q))[0])


@needs_kernels
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_linears_share_one_kernel_call(mode):
    """Tiled weights of one mode and group go in one call with the same products as one call each."""
    keys = jax.random.split(jax.random.key(5), 4)
    ws = [tile(quantize(jax.random.normal(k, (128, n), jnp.float32), 1, mode, 32)) for k, n in zip(keys, (64, 40, 100))]
    x = jax.random.normal(keys[3], (3, 128), jnp.float32)
    joint = jax.jit(linears)(x, ws)
    for y, w in zip(joint, ws):
        np.testing.assert_array_equal(np.asarray(y), np.asarray(linear(x, w)))
    assert jax.jit(linears).lower(x, ws).as_text().count(f"jaxinfer_{mode}_matmul") == 1
    if mode == "int4":  # another group size cannot share the call: one each, same products
        mixed = [ws[0], tile(quantize(jax.random.normal(keys[0], (128, 64), jnp.float32), 1, mode, 64))]
        assert jax.jit(linears).lower(x, mixed).as_text().count("jaxinfer_int4_matmul") == 2
        for y, w in zip(linears(x, mixed), mixed):
            np.testing.assert_array_equal(np.asarray(y), np.asarray(linear(x, w)))


def test_errors_name_the_value_and_the_choices():
    _, weights = load_weights(DEMO_MODEL, jnp.float32)
    with pytest.raises(ValueError, match="quantization='int3'.*'int8', 'int4', 'fp8'"):
        quantize_weights(weights, "int3")
    with pytest.raises(ValueError, match="group size 48"):
        quantize_weights(weights, "int4", 48)
    with pytest.raises(ValueError, match="group size 128 does not divide x's input size 64"):
        quantize(jnp.ones((64, 8)), 1, "int4", 128, "x")
    with pytest.raises(ValueError, match="stored as 'int8'"):
        quantize_weights(quantize_weights(weights, "int8"), "int4")
    with pytest.raises(ValueError, match="quantize_lm_head=True .* needs quantization=.*got quantization=None"):
        LLM(max_seq_len=64, quantize_lm_head=True)
    with pytest.raises(TypeError, match="quantize_lm_head must be True or False, got 'yes'"):
        LLM(max_seq_len=64, quantization="int8", quantize_lm_head="yes")


@pytest.mark.parametrize("mode,limit", [("int8", 0.52), ("int4", 0.30)])
def test_quantized_head_runs_and_the_tie_stays(tmp_path, mode, limit):
    """The running head is a quantized copy of the tied embedding; `weights` is still the tied model."""
    llm = LLM(dtype="bfloat16", max_seq_len=64, quantization=mode, quantize_lm_head=True)
    head = llm._run_weights.lm_head
    assert isinstance(head, QuantizedWeight) and (head.mode, head.shape) == (mode, llm.weights.embed.T.shape)
    assert tree_bytes(head) <= limit * tree_bytes(llm.weights.embed)
    assert llm.weights.lm_head is None and llm.weights.embed.dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="quantized output head"):  # converted checkpoints keep the head as is
        save_converted(quantize_head(llm.weights, mode, 32, UNSHARDED), DEMO_MODEL, tmp_path / "out")
    assert not (tmp_path / "out").exists()


CONVERT_PARAMS = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
CONVERT_PROMPTS = ["def parse(line):\n", "class Stack:\n"]


@pytest.fixture(scope="module")
def quantized_at_load() -> dict:
    """Per mode: an LLM on the demo model quantized at load (bf16), built once for the tests below."""
    return {mode: LLM(dtype="bfloat16", max_seq_len=128, quantization=mode) for mode in ("int8", "int4", "fp8")}


def test_llm_quantizes_at_load(quantized_at_load):
    reference = LLM(dtype="bfloat16", max_seq_len=128).generate(CONVERT_PROMPTS, CONVERT_PARAMS)
    llm = quantized_at_load["int8"]
    assert isinstance(llm.weights.layers[0].wq, QuantizedWeight) and llm.weights.embed.dtype == jnp.bfloat16
    out = llm.generate(CONVERT_PROMPTS, CONVERT_PARAMS)
    same = np.mean([np.mean(np.array(a.token_ids) == np.array(b.token_ids)) for a, b in zip(reference, out)])
    assert same >= 0.9, same


# Tokens are compared for int8 only: generating with int4 and fp8 leaves compiles programs no
# other test uses (about 15 s each on a 2-core CPU); equal stored leaves imply equal tokens.
@pytest.mark.parametrize("mode,values_dtype,group,compare_tokens", [
    ("int8", jnp.int8, 0, True), ("int4", jnp.uint8, 32, False), ("fp8", jnp.float8_e4m3fn, 0, False),
])
def test_convert_stores_what_load_quantizes(quantized_at_load, tmp_path, mode, values_dtype, group, compare_tokens):
    llm = quantized_at_load[mode]
    assert cli_main(["convert", str(DEMO_MODEL), str(tmp_path / "q"), "--quantize", mode]) == 0
    stored = LLM(tmp_path / "q", max_seq_len=128)
    first = stored.weights.layers[0].wq
    assert (first.mode, first.group, first.values.dtype) == (mode, group, values_dtype)
    assert stored.weights.embed.dtype == llm.weights.embed.dtype == jnp.bfloat16  # embedding not quantized
    for q, expected in zip(projections(stored.weights), projections(llm.weights), strict=True):
        assert (q.mode, q.group, q.tiled) == (expected.mode, expected.group, expected.tiled)
        np.testing.assert_array_equal(np.asarray(q.values), np.asarray(expected.values))
        np.testing.assert_array_equal(np.asarray(q.scales), np.asarray(expected.scales))
    if compare_tokens:
        tokens = [o.token_ids for o in stored.generate(CONVERT_PROMPTS, CONVERT_PARAMS)]
        assert tokens == [o.token_ids for o in llm.generate(CONVERT_PROMPTS, CONVERT_PARAMS)]
