"""Compiling an engine's programs before its first request, several at a time.

A GPU compiles a Llama-3.2-1B step program in about 7 s. Each program is made ready through the
runner's table (runtime/executables): one the program store holds is loaded on a worker without
being traced; any other is traced and lowered on the calling thread (tracing holds the GIL) and
handed to a worker that compiles and stores it, so tracing the next overlaps compiling the last.
Nothing runs. On CPU warm-up stops short of the process's memory-map cap (see memory_maps), which
a default engine's ~20 programs stay far below.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed

import jax
from tqdm.auto import tqdm

from jaxinfer.runtime.executables import Executables, Loaded, Program
from jaxinfer.runtime.memory_maps import MAX_MAP_COUNT, map_headroom, warmup_may_continue

Progress = Callable[[int, int], None]  # (programs done, programs in all), e.g. for a server's /health

log = logging.getLogger(__name__)
MAX_THREADS = 8
BAR = dict(desc="compiling step programs", unit="program")


def default_compile_threads() -> int:
    """One per core, up to MAX_THREADS (XLA compiles a program on one thread)."""
    return max(1, min(MAX_THREADS, os.cpu_count() or 1))


def warm_up(
    programs: list[Callable[[], Program]], executables: Executables, progress: bool, threads: int | None,
    on_program: Progress | None = None, seconds: dict[str, float] | None = None,
) -> int:
    """Make every program (each made by a thunk, on this thread) ready on `threads` workers; how many.

    On CPU it stops early when one more program would leave less than the reserve of the
    process's memory-map cap (the rest compile on first use). seconds, when given, gets "trace"
    (making, tracing and lowering the programs on this thread), "compile" (the workers' compiles,
    loads from the persistent cache or from the program store, summed over workers) and "stored"
    (how many programs came from the program store, untraced).
    """
    threads = default_compile_threads() if threads is None else threads
    done, start, trace, compile_, stored = 0, map_headroom(), 0.0, 0.0, 0
    bar = tqdm(total=len(programs), **BAR, disable=not progress)
    with ThreadPoolExecutor(max(threads, 1)) as pool:
        futures = []
        for make in programs:
            if _near_map_cap(len(futures), len(programs), start):
                break
            began = time.perf_counter()
            job = executables.plan(make())
            trace += time.perf_counter() - began
            futures.append(pool.submit(job))
            if threads <= 1:  # one at a time: the map count above sees each program
                loaded: Loaded = futures[-1].result()
                compile_, stored, done = compile_ + loaded.seconds, stored + loaded.stored, done + 1
                _report(bar, on_program, done, len(programs))
        if threads > 1:
            for done, future in enumerate(as_completed(futures), start=1):
                loaded = future.result()
                compile_, stored = compile_ + loaded.seconds, stored + loaded.stored
                _report(bar, on_program, done, len(programs))
    bar.close()
    if seconds is not None:
        seconds.update(trace=trace, compile=compile_, stored=stored)
    log.info("warm-up: %d programs, %d from the program store; tracing and lowering %.1f s, compiling or loading "
             "%.1f s over %d workers", len(futures), stored, trace, compile_, threads)
    return len(futures)


def _near_map_cap(submitted: int, total: int, start: int | None) -> bool:
    """On CPU, True (with a warning) when one more program would leave less than the reserve of the
    memory-map cap; start is the headroom before the first program (None where unknown)."""
    # with several threads some programs may still be compiling: an estimate
    per_program = 0 if start is None or not submitted else (start - map_headroom()) / submitted
    if jax.default_backend() != "cpu" or warmup_may_continue(per_program):
        return False
    log.warning(
        "warm-up stopped after %d of %d programs: XLA:CPU maps ~%.0f memory regions per program and "
        "this process is near vm.max_map_count (%s); the rest compile on first use. Raise the cap "
        "(sudo sysctl -w vm.max_map_count=262144)", submitted, total, per_program, MAX_MAP_COUNT.read_text().strip(),
    )
    return True


def _report(bar: tqdm, on_program: Progress | None, done: int, total: int) -> None:
    bar.update(1)
    if on_program is not None:
        on_program(done, total)


def activation_peak(programs: list[Program], executables: Executables) -> int:
    """Device bytes the largest step programs need beside the weights and the page pools.

    XLA's buffer assignment knows each program's temporaries and outputs exactly, so the
    programs are compiled (against a pool of one sequence, which the programs hold: the pool is
    donated, its size not part of the peak), not run: JAX cannot reset a device's peak counter,
    which would also hold an earlier model's. Costs one compile (or a load from the program store)
    per profiled step at load (accelerators only).
    """
    peak = 0
    for program in programs:
        memory = executables.compiled(program).memory_analysis()
        if memory is None:
            log.warning("no memory analysis on %s: the KV pool is sized without a step's activations",
                        jax.default_backend())
            return 0
        peak = max(peak, memory.temp_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes)
    return peak
