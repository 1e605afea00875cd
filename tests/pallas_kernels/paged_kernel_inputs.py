"""Random paged-attention inputs with poisoned memory, shared by the kernel tests.

Every KV slot that no valid query may read is NaN (int8 caches: NaN scales):
pages outside any page table, page-table entries past the sequence or before its
sliding window, and unused slots of partially filled pages. Padding query rows are
NaN too. A kernel that reads the wrong page or leaks padding produces NaN.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import quantize_kv

H100_SHARED_MEMORY = 232448  # 227 KiB opt-in shared memory per block
EXTRA_POOL_PAGES = 5  # pages owned by nobody, all poison
DEVICE_TESTS_ENV = "PALLAS_KERNELS_DEVICE_TESTS"


@dataclasses.dataclass(frozen=True)
class PagedInputs:
    """One attention problem; `kwargs` holds the int8 scales when quantized."""

    q: jax.Array  # [batch, max_q, num_q_heads, head_dim]
    k_pages: jax.Array  # [num_kv_heads, num_pages, page_size, head_dim]
    v_pages: jax.Array  # [num_kv_heads, num_pages, page_size, head_dim]
    lengths: jax.Array  # [batch] int32
    page_indices: jax.Array  # [batch, pages_per_seq] int32
    query_lens: jax.Array  # [batch] int32
    kwargs: dict

    @property
    def decode_args(self) -> tuple:
        """Positional arguments of the decode entry points (query 0 only)."""
        return (self.q[:, 0], self.k_pages, self.v_pages, self.lengths, self.page_indices)

    @property
    def ragged_args(self) -> tuple:
        """Positional arguments of the ragged entry points."""
        return (self.q, self.k_pages, self.v_pages, self.lengths, self.page_indices, self.query_lens)


def _needed_slots(lengths, query_lens, pages_per_seq, page_size, window) -> np.ndarray:
    """[batch, pages_per_seq * page_size] bool: key positions some valid query attends."""
    pos = np.arange(pages_per_seq * page_size)[None, :]
    lengths, query_lens = np.asarray(lengths)[:, None], np.asarray(query_lens)[:, None]
    needed = pos < lengths
    if window is not None:
        needed &= pos > lengths - query_lens - window
    return needed


def make_inputs(
    key: jax.Array,
    *,
    lengths: list[int],
    query_lens: list[int] | None = None,  # None: decode (one query per sequence)
    max_q: int = 1,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    pages_per_seq: int,
    dtype=jnp.float32,
    int8: bool = False,
    sliding_window: int | None = None,
    out_of_range_entries: bool = False,
) -> PagedInputs:
    """Random inputs where every slot the kernel must not read is poisoned.

    With `out_of_range_entries`, page-table entries nobody reads hold an invalid page
    id instead of a poison page (the TPU interpreter raises on out-of-bounds DMAs).
    """
    batch = len(lengths)
    query_lens = [1] * batch if query_lens is None else query_lens
    # Lengths may pass the capacity (pages_per_seq * page_size), as speculative verification
    # asks near the end of the buffer: those queries see every key the table holds.
    assert max(query_lens) <= max_q
    num_pages = batch * pages_per_seq + EXTRA_POOL_PAGES
    kq, kk, kv, kperm = jax.random.split(key, 4)
    shape = (num_kv_heads, num_pages, page_size, head_dim)
    k = np.array(jax.random.normal(kk, shape, jnp.float32))
    v = np.array(jax.random.normal(kv, shape, jnp.float32))
    owned = np.array(jax.random.permutation(kperm, num_pages))
    poison_pages = owned[batch * pages_per_seq :]
    table = owned[: batch * pages_per_seq].reshape(batch, pages_per_seq)

    needed = _needed_slots(lengths, query_lens, pages_per_seq, page_size, sliding_window)
    needed = needed.reshape(batch, pages_per_seq, page_size)
    slot_ok = np.zeros((num_pages, page_size), bool)
    slot_ok[table] = needed
    page_needed = needed.any(-1)
    # Table entries for pages nobody reads point into the poison pool.
    if out_of_range_entries:
        unused = num_pages + 1000
    else:
        unused = poison_pages[np.arange(pages_per_seq) % len(poison_pages)]
    table = np.where(page_needed, table, unused)

    kwargs = {}
    if int8:
        k_q, k_s = (np.array(a) for a in quantize_kv(jnp.asarray(k)))
        v_q, v_s = (np.array(a) for a in quantize_kv(jnp.asarray(v)))
        k_s[:, ~slot_ok], v_s[:, ~slot_ok] = np.nan, np.nan
        k_q[:, ~slot_ok], v_q[:, ~slot_ok] = 127, 127
        k_pages, v_pages = jnp.asarray(k_q), jnp.asarray(v_q)
        kwargs = dict(k_scales=jnp.asarray(k_s), v_scales=jnp.asarray(v_s))
    else:
        k[:, ~slot_ok], v[:, ~slot_ok] = np.nan, np.nan
        k_pages, v_pages = jnp.asarray(k, dtype), jnp.asarray(v, dtype)

    q = np.array(jax.random.normal(kq, (batch, max_q, num_q_heads, head_dim), jnp.float32))
    q[np.arange(max_q)[None, :] >= np.asarray(query_lens)[:, None]] = np.nan
    return PagedInputs(
        q=jnp.asarray(q, dtype), k_pages=k_pages, v_pages=v_pages,
        lengths=jnp.asarray(lengths, jnp.int32), page_indices=jnp.asarray(table, jnp.int32),
        query_lens=jnp.asarray(query_lens, jnp.int32), kwargs=kwargs,
    )


def tolerance(dtype) -> dict:
    """assert_allclose tolerances: bf16 outputs carry ~3 significant digits."""
    return dict(atol=2e-2, rtol=2e-2) if dtype == jnp.bfloat16 else dict(atol=1e-4, rtol=1e-4)


def assert_close(actual: jax.Array, expected: jax.Array, dtype) -> None:
    """Finite, same shape and dtype, and close to the reference."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    assert np.isfinite(actual).all(), "kernel read poisoned memory (NaN in output)"
    np.testing.assert_allclose(actual, expected, **tolerance(dtype))


def require_device(platform: str) -> None:
    """Skip unless jax runs on `platform`; fail instead when PALLAS_KERNELS_DEVICE_TESTS=platform."""
    if jax.default_backend() == platform:
        return
    message = f"needs a {platform} device (jax backend is {jax.default_backend()})"
    if os.environ.get(DEVICE_TESTS_ENV) == platform:
        pytest.fail(f"{DEVICE_TESTS_ENV}={platform} but {message}")
    pytest.skip(message)


def lower_for(platform: str, fn, *args) -> str:
    """Cross-lower jit(fn)(*args) for "cuda" or "tpu" from any host; returns the StableHLO text.

    jax >= 0.11 reads the Triton target from the default device, so on a host
    without a GPU the cuda lowering runs under an abstract H200.
    """
    context = contextlib.nullcontext()
    if platform == "cuda" and jax.default_backend() != "gpu":
        device = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
        context = jax.sharding.use_abstract_mesh(
            jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
        )
    with context:
        return jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()


@dataclasses.dataclass(frozen=True)
class KernelBlocks:
    """What one traced pallas_call holds per program: its settings and the blocks it reads."""

    compiler_params: object
    loads: list  # avals of every ref read in the kernel body
    scratch: list  # avals of the scratch buffers (TPU VMEM blocks, semaphores)


def kernel_blocks(fn, *args) -> KernelBlocks:
    """The single pallas_call of jit(fn)(*args), as traced (no device needed)."""
    calls = list(_pallas_calls(jax.make_jaxpr(fn)(*args).jaxpr))
    assert len(calls) == 1, f"expected one pallas_call, found {len(calls)}"
    eqn = calls[0]
    body = eqn.params["jaxpr"]
    scratch_count = eqn.params["grid_mapping"].num_scratch_operands
    scratch = [v.aval for v in body.invars[len(body.invars) - scratch_count:]] if scratch_count else []
    loads = [v.aval for e in _eqns(body) if e.primitive.name == "get" for v in e.outvars]
    return KernelBlocks(eqn.params["compiler_params"], loads, scratch)


def _pallas_calls(jaxpr):
    for eqn in _eqns(jaxpr):
        if eqn.primitive.name == "pallas_call":
            yield eqn


def _eqns(jaxpr):
    """Every equation of jaxpr and of the jaxprs nested in it (not inside pallas_call bodies)."""
    for eqn in jaxpr.eqns:
        yield eqn
        if eqn.primitive.name == "pallas_call":
            continue
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)
            if hasattr(inner, "eqns"):
                yield from _eqns(inner)


def triton_shared_memory(blocks) -> int:
    """Bytes per program from the traced kernel: num_stages copies of each K/V block (and scales)
    plus one float32 [rows, max(head_dim, keys)] tile for the dot operands' layout conversion."""
    pages = [a for a in blocks.loads if a.ndim == 3]  # [pages_per_block, page_size, head_dim] (+ scales)
    kv = [a for a in pages if a.dtype != jnp.float32 or a.shape[-1] > 1]
    rows = max(a.shape[0] for a in blocks.loads if a.ndim == 2 and a.shape[1] > 1)
    keys = kv[0].shape[0] * kv[0].shape[1]
    head_dim = kv[0].shape[-1]
    kv_bytes = sum(a.size * a.dtype.itemsize for a in kv[:2])
    return blocks.compiler_params.num_stages * kv_bytes + rows * max(head_dim, keys) * 4
