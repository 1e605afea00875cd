"""Several processes (one per host) as one JAX program: `initialize` wraps `jax.distributed.initialize`.

After it, `jax.devices()` lists every process's devices, so `LLM(tensor_parallel_size=...,
data_parallel_size=...)` builds one global mesh across hosts. Every process runs the same
script with the same prompts (JAX's multi-controller model): each one feeds the same host
arrays, the devices exchange activations over the mesh, and every process receives the
outputs (print them on process 0).
"""

from __future__ import annotations

import secrets
from typing import Any, Sequence

import jax
import numpy as np

CPU_COLLECTIVES = ("gloo", "mpi", "none")


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: Sequence[int] | None = None,
    cpu_collectives: str = "gloo",
    **kwargs: Any,
) -> None:
    """Join the processes into one runtime; call before anything else touches jax.

    Arguments are `jax.distributed.initialize`'s (all None on Cloud TPU and SLURM, where they
    are detected). cpu_collectives picks how CPU devices of different processes talk (gloo
    over TCP by default); it does not affect GPUs or TPUs.
    """
    if cpu_collectives not in CPU_COLLECTIVES:
        raise ValueError(f"cpu_collectives {cpu_collectives!r} is not one of {', '.join(CPU_COLLECTIVES)}")
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    jax.distributed.initialize(
        coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id,
        local_device_ids=local_device_ids, **kwargs,
    )


def shared_seed() -> int:
    """A random seed every process agrees on (process 0's), for requests that gave none."""
    seed = secrets.randbits(63)
    if jax.process_count() == 1:
        return seed
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.int64(seed)))
