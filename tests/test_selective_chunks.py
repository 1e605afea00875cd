"""Mamba-1's chunked selective scan (models/selective_chunks) against the per-token scan it replaces for prefill
steps on accelerators: the same outputs and slot states on a packed step of random inputs (requests continuing
from nonzero states, starting afresh, ragged, across chunk boundaries, padding), float32, and the program lowering
for CUDA and TPU with no host round trip; the chunk sized by the state's width. RecurrentGemma's RG-LRU (one
state entry per channel, models/rg_lru) through the same chunked scan: the scan's outputs and states."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from accelerator_programs import round_trips
from jax import export

from jaxinfer.cache.state_pool import LayerState
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models import rg_lru
from jaxinfer.models.mamba1_mixer import packed_chunked, packed_scan
from jaxinfer.models.selective_chunks import chunk_tokens
from jaxinfer.models.ssd_chunks import segments

# 6 channels of 5 state entries, a 4-wide conv (its state unused here), chunks of 8 tokens.
SS = dataclasses.replace(StateSpace.selective((0,), inner=6, state_size=5, kernel=4, rank=2, conv_bias=True,
                                              proj_bias=False), chunk_size=8)
SLOTS = 6
# (slot, first position, tokens) packed end to end, then 4 padding tokens: 37 tokens, 5 chunks of 8 (the last
# partial). Slot 2 continues its state at a chunk's start, slot 0 starts afresh mid-chunk, slot 3 is one decode
# token at a chunk's start, slot 1 starts afresh and spans three chunks, slot 4 continues mid-chunk across three
# chunks; slot 5 is in none (its state must stay).
PLAN = [(2, 5, 5), (0, 0, 3), (3, 7, 1), (1, 0, 14), (4, 3, 10)]


def packed_step(heads: int = 1) -> tuple:
    """(A [I, N], random pools with the step's token slots, x and dt [T, I], B and C [T, heads, N], positions [T],
    segments): dt through softplus and A = -exp(a_log), as the mixer makes them (2 heads: Zamba's per-head B and C,
    each read by 3 channels)."""
    rng = np.random.RandomState(0)

    def normal(*shape: int, scale: float = 1.0) -> jax.Array:
        return jnp.asarray(rng.randn(*shape).astype(np.float32) * scale)

    slots = [s for s, _, n in PLAN for _ in range(n)] + [1] * 4
    positions = jnp.asarray([p for _, first, n in PLAN for p in range(first, first + n)] + [-1] * 4)
    I, N, T = SS.inner, SS.state_size, len(slots)
    state = LayerState(normal(SLOTS, 3, I), normal(SLOTS, I, 1, N), jnp.asarray(slots))
    a = -jnp.exp(normal(I, N, scale=0.5))
    dt = jax.nn.softplus(normal(T, I))
    seg = segments(state.token_slots, positions, SLOTS)
    return a, state, normal(T, I), dt, normal(T, heads, N), normal(T, heads, N), positions, seg


def recurrence(run):
    """run(ss, a, state, x, dt, b, c, positions, seg) jitted over everything but the dims."""
    return jax.jit(lambda *step: run(SS, *step))


@pytest.mark.parametrize("heads", [1, 2])
def test_chunked_scan_gives_the_scans_outputs_and_states(heads):
    step = packed_step(heads)
    with jax.default_matmul_precision("highest"):  # a GPU's default float32 dots would round to TF32
        ssm_scan, y_scan = recurrence(packed_scan)(*step)
        ssm_chunk, y_chunk = recurrence(packed_chunked)(*step)
    real = np.asarray(step[6]) >= 0  # padding outputs are never read
    assert np.abs(np.asarray(y_chunk - y_scan)[real]).max() <= 1e-6 * np.abs(np.asarray(y_scan)).max()
    assert np.abs(np.asarray(ssm_chunk - ssm_scan)).max() <= 1e-6 * np.abs(np.asarray(ssm_scan)).max()
    np.testing.assert_array_equal(ssm_chunk[5], step[1].ssm[5])


def test_chunked_scan_lowers_for_gpu_and_tpu_with_no_host_round_trip():
    step = packed_step()
    program = recurrence(packed_chunked)
    assert round_trips(jax.make_jaxpr(program)(*step).jaxpr) == []
    exported = export.export(program, platforms=("cuda", "tpu"))(*step)
    assert exported.out_avals[-1].shape == (37, SS.inner)  # y, after the pool


def test_the_chunk_is_a_power_of_two_within_chunk_size_and_the_budget():
    """Q * I * N float32 at most 16 MiB: Mamba-130M's 1536 x 16 take 128 tokens, FalconMamba-7B's 8192 x 16 32."""
    assert chunk_tokens(SS) == 8
    for inner, chunk in ((1536, 128), (8192, 32), (2, 256)):
        ss = StateSpace.selective((0,), inner=inner, state_size=16, kernel=4, rank=2, conv_bias=True, proj_bias=False)
        assert chunk_tokens(ss) == chunk
    assert chunk_tokens(dataclasses.replace(SS, chunk_size=12)) == 8


def test_rg_lru_chunked_gives_the_scans_outputs_and_states():
    """The RG-LRU's h <- a h + u ([T, W] decays in (0, 1), one entry per channel) on the same packed step."""
    ss = dataclasses.replace(StateSpace.rg_lru((0,), width=6, kernel=4), chunk_size=8)
    _, state, u, _, _, _, positions, seg = packed_step()
    state = dataclasses.replace(state, ssm=state.ssm[..., :1])  # [S, W, 1, 1]
    a = jax.nn.sigmoid(u[::-1] * 3.0)
    run = lambda form: jax.jit(lambda *step: form(ss, *step))(state, a, u, positions, seg)  # noqa: E731
    ssm_scan, h_scan = run(rg_lru.packed_scan)
    ssm_chunk, h_chunk = run(rg_lru.packed_chunked)
    real = np.asarray(positions) >= 0
    assert np.abs(np.asarray(h_chunk - h_scan)[real]).max() <= 1e-6 * np.abs(np.asarray(h_scan)).max()
    assert np.abs(np.asarray(ssm_chunk - ssm_scan)).max() <= 1e-6 * np.abs(np.asarray(ssm_scan)).max()
    np.testing.assert_array_equal(ssm_chunk[5], state.ssm[5])
