"""The chunked SSD (models/ssd_chunks) against the per-token scan it replaces for prefill steps: the same outputs
and slot states on a packed step of random inputs, float32, and the same program lowering for CUDA and TPU with
no host round trip; LFM2's short conv, which reads the same conv windows, likewise against a per-token conv; MiniMax's
lightning attention, the SSD with dt 1, in both forms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from accelerator_programs import round_trips
from jax import export

from jaxinfer.cache.state_pool import LayerState
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.lightning_attention import lightning_state
from jaxinfer.models.lightning_attention import recurrence as lightning_recurrence
from jaxinfer.models.mamba2_mixer import MixerWeights, chunked_form, packed_chunked, packed_scan
from jaxinfer.models.short_conv import ShortConvWeights, short_conv

# 4 heads of 3 dims in 2 groups, 5 state dims, a 4-wide conv, chunks of 8.
SS = StateSpace(layers=(0,), num_heads=4, head_dim=3, state_size=5, n_groups=2, conv_kernel=4, chunk_size=8)
SLOTS = 6
# (slot, first position, tokens) packed end to end, then 4 padding tokens: 37 tokens, 5 chunks (the last partial).
# Slot 2 continues its state at a chunk's start, slot 0 starts afresh mid-chunk, slot 3 is one decode token at
# a chunk's start, slot 1 starts afresh and spans three chunks, slot 4 continues mid-chunk across three chunks;
# slot 5 is in none (its state must stay).
PLAN = [(2, 5, 5), (0, 0, 3), (3, 7, 1), (1, 0, 14), (4, 3, 10)]


def packed_step() -> tuple[LayerState, jax.Array, jax.Array, jax.Array, MixerWeights]:
    """(random pools with the step's token slots, xbc [T, C], dt [T, H], positions [T], weights)."""
    rng = np.random.RandomState(0)

    def normal(*shape: int, scale: float = 1.0) -> jax.Array:
        return jnp.asarray(rng.randn(*shape).astype(np.float32) * scale)

    slots = [s for s, _, n in PLAN for _ in range(n)] + [1] * 4
    positions = [p for _, first, n in PLAN for p in range(first, first + n)] + [-1] * 4
    C, H, T = SS.conv_dim, SS.num_heads, len(slots)
    weights = MixerWeights(in_proj=None, conv_weight=normal(C, 1, 4, scale=0.5), dt_bias=normal(H, scale=0.5),
                           a_log=normal(H, scale=0.5), d_skip=normal(H), gate_norm=None, out_proj=None,
                           conv_bias=normal(C, scale=0.1))
    state = LayerState(normal(SLOTS, 3, C), normal(SLOTS, H, SS.head_dim, SS.state_size), jnp.asarray(slots))
    return state, normal(T, C), normal(T, H), jnp.asarray(positions), weights


def recurrence(run):
    """run(ss, w, state, xbc, dt, positions) jitted over everything but the dims."""
    return jax.jit(lambda state, xbc, dt, positions, w: run(SS, w, state, xbc, dt, positions))


def test_chunked_ssd_gives_the_scans_outputs_and_states():
    step = packed_step()
    scanned, y_scan = recurrence(packed_scan)(*step)
    chunked, y_chunk = recurrence(packed_chunked)(*step)
    real = np.asarray(step[3]) >= 0  # padding outputs are never read
    assert np.abs(np.asarray(y_chunk - y_scan)[real]).max() <= 2e-6 * np.abs(np.asarray(y_scan)).max()
    assert np.abs(np.asarray(chunked.ssm - scanned.ssm)).max() <= 2e-6 * np.abs(np.asarray(scanned.ssm)).max()
    np.testing.assert_array_equal(chunked.conv, scanned.conv)
    np.testing.assert_array_equal(chunked.ssm[5], step[0].ssm[5])


def test_chunked_ssd_lowers_for_gpu_and_tpu_with_no_host_round_trip():
    step = packed_step()
    program = recurrence(packed_chunked)
    assert round_trips(jax.make_jaxpr(program)(*step).jaxpr) == []
    exported = export.export(program, platforms=("cuda", "tpu"))(*step)
    assert exported.out_avals[-1].shape == (37, SS.num_heads, SS.head_dim)  # y, after the pools


def test_a_chunk_size_below_one_is_refused_by_name():
    with pytest.raises(ValueError, match="chunk_size 0 is not supported for the Mamba2 mixer"):
        StateSpace(layers=(0,), num_heads=4, head_dim=3, state_size=5, n_groups=2, conv_kernel=4, chunk_size=0)


def test_steps_of_a_chunk_or_more_take_the_chunked_form_on_accelerators_only():
    assert chunked_form(SS, 8, "gpu") and chunked_form(SS, 512, "tpu")
    assert not chunked_form(SS, 7, "gpu")  # decode and small steps: the scan
    assert not chunked_form(SS, 512, "cpu")  # a CPU ran the scan faster at every size measured


def test_short_conv_gives_a_per_token_convs_outputs_and_states_and_lowers_for_gpu_and_tpu():
    """LFM2's short conv (models/short_conv) over the same packed step reads the same segment-aware windows: its
    outputs and slot states are a token-by-token conv's from each slot's state (zeros at position 0; slot 5 kept),
    and the program lowers for CUDA and TPU with no host round trip."""
    state, _, _, positions, _ = packed_step()
    rng = np.random.RandomState(1)
    D, K, T = 8, 3, positions.shape[0]
    w = ShortConvWeights(conv_in=jnp.asarray(rng.randn(D, 3 * D), jnp.float32),
                         conv_weight=jnp.asarray(rng.randn(D, 1, K), jnp.float32),
                         conv_out=jnp.asarray(rng.randn(D, D), jnp.float32),
                         conv_bias=jnp.asarray(rng.randn(D), jnp.float32))
    pools = LayerState(jnp.asarray(rng.randn(SLOTS, K - 1, D), jnp.float32), None, state.token_slots)
    h = jnp.asarray(rng.randn(1, T, D), jnp.float32)
    program = jax.jit(short_conv)
    out, after = program(w, h, positions[None], pools)
    b, c, x = np.split(np.asarray(h[0]) @ np.asarray(w.conv_in), 3, axis=-1)
    conv, expected = np.array(pools.conv), np.zeros((T, D), np.float32)
    for t, (slot, position) in enumerate(zip(np.asarray(state.token_slots), np.asarray(positions))):
        if position < 0:
            continue
        window = np.concatenate([0 * conv[slot] if position == 0 else conv[slot], (b * x)[t][None]])
        conv[slot] = window[1:]
        mixed = (window * np.asarray(w.conv_weight)[:, 0].T).sum(0) + np.asarray(w.conv_bias)
        expected[t] = (c[t] * mixed) @ np.asarray(w.conv_out)
    real = np.asarray(positions) >= 0
    np.testing.assert_allclose(np.asarray(out[0])[real], expected[real], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(after.conv), conv, rtol=1e-5, atol=1e-5)
    assert round_trips(jax.make_jaxpr(program)(w, h, positions[None], pools).jaxpr) == []
    exported = export.export(program, platforms=("cuda", "tpu"))(w, h, positions[None], pools)
    assert exported.out_avals[0].shape == (1, T, D)


def test_lightning_attention_chunked_gives_the_recurrences_outputs_and_states_and_lowers_for_gpu_and_tpu():
    """MiniMax's lightning recurrence in the chunked SSD's form (pools marked "gpu"; dt 1, A the negated rates, B the
    keys, C the queries, x the values) over the same packed step: each token's output and each slot's state are
    S <- exp(-rate) S + v k^T, o = S q run token by token from its slot's state (zeros at position 0; slot 5 kept),
    and the program lowers for CUDA and TPU with no host round trip."""
    ss = lightning_state((0,), heads=4, head_dim=3, block=8)
    state, _, _, positions, _ = packed_step()
    rng = np.random.RandomState(2)
    pools = LayerState(jnp.zeros((SLOTS, 0, ss.conv_dim)), jnp.asarray(rng.randn(SLOTS, 4, 3, 3), jnp.float32),
                       state.token_slots, platform="gpu")
    q, k, v = (jnp.asarray(rng.randn(positions.shape[0], 4, 3), jnp.float32) for _ in range(3))
    rates = jnp.asarray([0.5, 0.25, 0.125, 0.0625], jnp.float32)
    program = jax.jit(lambda pools, *a: lightning_recurrence(ss, pools, *a))
    after, out = program(pools, q, k, v, rates, positions)
    ssm, expected = np.array(pools.ssm), np.zeros(q.shape, np.float32)
    decay = np.exp(-np.asarray(rates))[:, None, None]
    qs, ks, vs = np.asarray(q), np.asarray(k), np.asarray(v)
    for t, (slot, position) in enumerate(zip(np.asarray(state.token_slots), np.asarray(positions))):
        if position < 0:
            continue
        ssm[slot] = (0 if position == 0 else decay * ssm[slot]) + vs[t][:, :, None] * ks[t][:, None]
        expected[t] = np.einsum("hpn,hn->hp", ssm[slot], qs[t])
    real = np.asarray(positions) >= 0
    np.testing.assert_allclose(np.asarray(out)[real], expected[real], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(after.ssm), ssm, rtol=1e-5, atol=1e-5)
    assert round_trips(jax.make_jaxpr(program)(pools, q, k, v, rates, positions).jaxpr) == []
    exported = export.export(program, platforms=("cuda", "tpu"))(pools, q, k, v, rates, positions)
    assert exported.out_avals[-1].shape == (37, 4, 3)
