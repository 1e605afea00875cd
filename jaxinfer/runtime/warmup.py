"""Compiling an engine's step programs before its first request, several at a time.

A GPU compiles a Llama-3.2-1B step program in about 7 s (an H200 warmed a 27-program workload in
186 s), and a serve start compiles every shape the knobs allow, a hundred or more. Each program
is traced on the calling thread (tracing holds the GIL) and handed to a worker that compiles it,
so tracing the next overlaps compiling the last. jit's own caches keep what the workers
compiled: the padding-only runs that follow, and every later step of those shapes, compile
nothing. On CPU one thread by default: XLA:CPU maps each program's code into memory regions,
which the runs count against the process's cap as they go (see memory_maps).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import jax
from tqdm.auto import tqdm

from jaxinfer.runtime.host_step import HostStep
from jaxinfer.runtime.memory_maps import MAX_MAP_COUNT, map_headroom, warmup_may_continue

Program = tuple[Callable, list, dict]  # a compiled function, its arguments and keyword arguments

log = logging.getLogger(__name__)
MAX_THREADS = 8
BAR = dict(desc="compiling step programs", unit="program")


def default_compile_threads() -> int:
    """1 on CPU, else one per core up to MAX_THREADS."""
    return 1 if jax.default_backend() == "cpu" else max(1, min(MAX_THREADS, os.cpu_count() or 1))


Progress = Callable[[int, int], None]  # (programs done, programs in all), e.g. for a server's /health


def warm_up(
    program_for: Callable[[HostStep], Program], run: Callable[[HostStep], Any], hosts: list[HostStep],
    progress: bool, threads: int | None, on_program: Progress | None = None,
) -> int:
    """Compile (on `threads` workers) and run each host step; how many ran (CPU stops near its map cap).

    on_program hears of each program compiled (with one thread: compiled and run).
    """
    threads = default_compile_threads() if threads is None else threads
    if threads > 1:
        compile_all(program_for, hosts, threads, progress, on_program)
    ran, start = 0, map_headroom()
    for host in tqdm(hosts, **BAR, disable=not progress or threads > 1):
        per_program = 0 if start is None or not ran else (start - map_headroom()) / ran
        if jax.default_backend() == "cpu" and not warmup_may_continue(per_program):
            log.warning(
                "warm-up stopped after %d of %d step programs: XLA:CPU maps ~%.0f memory regions per program "
                "and this process is near vm.max_map_count (%s); the rest compile on first use. Raise the cap "
                "(sudo sysctl -w vm.max_map_count=262144) or lower max_num_seqs / max_num_batched_tokens",
                ran, len(hosts), per_program, MAX_MAP_COUNT.read_text().strip(),
            )
            break
        run(host)
        ran += 1
        if on_program is not None and threads == 1:
            on_program(ran, len(hosts))
    return ran


def compile_all(
    program_for: Callable[[HostStep], Program], hosts: list[HostStep], threads: int, progress: bool,
    on_program: Progress | None = None,
) -> None:
    """Each host step's program traced here and compiled on one of `threads` workers."""
    with ThreadPoolExecutor(threads) as pool:
        futures = []
        for host in hosts:
            program, args, kwargs = program_for(host)
            futures.append(pool.submit(program.lower(*args, **kwargs).compile))
        bar = tqdm(as_completed(futures), total=len(futures), **BAR, disable=not progress)
        for done, future in enumerate(bar, start=1):
            future.result()
            if on_program is not None:
                on_program(done, len(futures))


def activation_peak(program_for: Callable[[HostStep], Program], hosts: list[HostStep]) -> int:
    """Device bytes the largest step programs (`hosts`) need beside the weights and the page pools.

    XLA's buffer assignment knows each program's temporaries and outputs exactly, so the
    programs are compiled (against a pool of one sequence, which `program_for` holds: the pool is
    donated, its size not part of the peak), not run: JAX cannot reset a device's peak counter,
    which would also hold an earlier model's. Costs one compile per profiled step at load
    (accelerators only).
    """
    peak = 0
    for host in hosts:
        program, args, kwargs = program_for(host)
        memory = program.lower(*args, **kwargs).compile().memory_analysis()
        if memory is None:
            log.warning("no memory analysis on %s: the KV pool is sized without a step's activations",
                        jax.default_backend())
            return 0
        peak = max(peak, memory.temp_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes)
    return peak
