"""The chunked gated delta rule (models/delta_chunks) against the per-token scan it replaces for prefill steps on
accelerators: the same outputs and slot states on a packed step of random inputs, float32, with a decay per token
and head (Gated DeltaNet's) or per key channel (Kimi Delta Attention's), and the program lowering for CUDA and TPU
with no host round trip."""

from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from accelerator_programs import round_trips
from jax import export

from jaxinfer.cache.state_pool import LayerState
from jaxinfer.models.gated_deltanet import deltanet_state, packed_chunked, packed_scan

# 2 q/k heads of 5 dims, each serving 2 of the 4 value heads of 3 dims; a 4-wide conv; chunks of 8.
SS = dataclasses.replace(deltanet_state((0,), key_heads=2, key_dim=5, value_heads=4, value_dim=3, conv_kernel=4,
                                        eps=1e-6), chunk_size=8)
SLOTS = 6
# (slot, first position, tokens) packed end to end, then 4 padding tokens: 37 tokens, 5 chunks (the last partial).
# Slot 2 continues its state at a chunk's start, slot 0 starts afresh mid-chunk, slot 3 is one decode token at
# a chunk's start, slot 1 starts afresh and spans three chunks, slot 4 continues mid-chunk across three chunks;
# slot 5 is in none (its state must stay).
PLAN = [(2, 5, 5), (0, 0, 3), (3, 7, 1), (1, 0, 14), (4, 3, 10)]


def packed_step(per_channel: bool = False) -> tuple:
    """(random pools with the step's token slots, qkv [T, C], g [T, H] (or [T, H, N] per key channel, Kimi Delta
    Attention's), beta [T, H], positions [T], weights)."""
    rng = np.random.RandomState(0)

    def normal(*shape: int, scale: float = 1.0) -> jax.Array:
        return jnp.asarray(rng.randn(*shape).astype(np.float32) * scale)

    slots = [s for s, _, n in PLAN for _ in range(n)] + [1] * 4
    positions = [p for _, first, n in PLAN for p in range(first, first + n)] + [-1] * 4
    C, H, T = SS.conv_dim, SS.num_heads, len(slots)
    state = LayerState(normal(SLOTS, 3, C), normal(SLOTS, H, SS.head_dim, SS.state_size), jnp.asarray(slots))
    # log decays, as -exp(A_log) * softplus(a + dt_bias) gives them
    g = -jax.nn.softplus(normal(T, H, *(SS.state_size,) * per_channel))
    beta = jax.nn.sigmoid(normal(T, H))
    weights = types.SimpleNamespace(conv_weight=normal(C, 1, 4, scale=0.5))
    return state, normal(T, C), g, beta, jnp.asarray(positions), weights


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_token", "per_channel"])
def test_chunked_delta_rule_gives_the_scans_outputs_and_states(per_channel: bool):
    state, qkv, g, beta, positions, w = packed_step(per_channel)
    scanned, y_scan = jax.jit(lambda *a: packed_scan(SS, w.conv_weight, *a))(state, qkv, g, beta, positions)
    chunked, y_chunk = jax.jit(lambda *a: packed_chunked(SS, w.conv_weight, *a))(state, qkv, g, beta, positions)
    real = np.asarray(positions) >= 0  # padding outputs are never read
    assert np.abs(np.asarray(y_chunk - y_scan)[real]).max() <= 2e-6 * np.abs(np.asarray(y_scan)).max()
    assert np.abs(np.asarray(chunked.ssm - scanned.ssm)).max() <= 2e-6 * np.abs(np.asarray(scanned.ssm)).max()
    np.testing.assert_array_equal(chunked.conv, scanned.conv)
    np.testing.assert_array_equal(chunked.ssm[5], state.ssm[5])


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_token", "per_channel"])
def test_chunked_delta_rule_lowers_for_gpu_and_tpu_with_no_host_round_trip(per_channel: bool):
    state, qkv, g, beta, positions, w = packed_step(per_channel)
    program = jax.jit(lambda *a: packed_chunked(SS, w.conv_weight, *a))
    assert round_trips(jax.make_jaxpr(program)(state, qkv, g, beta, positions).jaxpr) == []
    exported = export.export(program, platforms=("cuda", "tpu"))(state, qkv, g, beta, positions)
    assert exported.out_avals[-1].shape == (37, SS.num_heads, SS.head_dim)  # y, after the pools
