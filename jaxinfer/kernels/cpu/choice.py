"""Whether an LLM runs the native CPU kernels: an explicit choice, resolved once at load.

The resolved bool travels with what is traced (packed weights are their own leaf type; the
contiguous KV cache carries it as a static field), so the trace-time dispatch never reads a
global or the environment.
"""

from __future__ import annotations

import os

import jax

from jaxinfer.kernels.cpu.build import load
from jaxinfer.kernels.cpu.cache_write import TARGET as CACHE_WRITE
from jaxinfer.kernels.cpu.decode_attention import TARGET as DECODE_ATTENTION
from jaxinfer.kernels.cpu.packed_matmul import TARGET as PACKED_MATMUL

ENV_OVERRIDE = "JAXINFER_CPU_KERNELS"  # "0" or "1": decides only when the argument is None
KERNELS = (
    ("packed_matmul.cc", "JaxinferPackedMatmul", PACKED_MATMUL),
    ("cache_write.cc", "JaxinferCacheWrite", CACHE_WRITE),
    ("decode_attention.cc", "JaxinferDecodeAttention", DECODE_ATTENTION),
)


def single_cpu_device() -> bool:
    """The kernels run on one CPU device only (no sharding across several)."""
    return jax.default_backend() == "cpu" and jax.device_count() == 1


def kernels_available() -> bool:
    """On a single CPU device, and all three kernels build (or are built) and verify."""
    return single_cpu_device() and all([load(*kernel) for kernel in KERNELS])


def _env_choice() -> bool | None:
    value = os.environ.get(ENV_OVERRIDE, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"${ENV_OVERRIDE}={value!r} is not accepted; use 0 (off), 1 (on) or leave it unset (auto)")
    return None if value == "" else value == "1"


def resolve_cpu_kernels(choice: bool | None) -> bool:
    """True/False as asked (True fails where they cannot run); None: $JAXINFER_CPU_KERNELS, else where available."""
    if choice is None:
        choice = _env_choice()
    if choice is False:
        return False
    available = kernels_available()
    if choice is True and not available:
        raise RuntimeError(
            "cpu_kernels=True, but the native CPU kernels cannot run here: they need a single CPU "
            f"device (backend {jax.default_backend()!r}, {jax.device_count()} device(s)) and a C++ "
            "compiler (see the log); pass cpu_kernels=None or False"
        )
    return available
