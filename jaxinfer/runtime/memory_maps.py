"""Memory-map headroom of this process (Linux): XLA:CPU's JIT maps every compiled kernel separately.

Each CPU program maps its kernels' code and data as separate small regions (about 260 per
step program of the 6-layer demo model, 310 for a 30-layer model), and Linux caps a process
at `vm.max_map_count` regions (65530 by default). Past the cap the JIT's next allocation
fails and LLVM aborts the process (a notebook kernel dies with every model it held), so
warm-up stops before it and says how to raise the cap, and an engine about to run a step
after new programs were compiled drops every compiled program of the process when the cap is
close (`release_programs_near_cap`): they come back from the persistent compilation cache
(~0.5 s for the demo model's) or the program store, or compile again when next used.
"""

from __future__ import annotations

import logging
import weakref
from pathlib import Path
from typing import Protocol

import jax

log = logging.getLogger(__name__)

MAX_MAP_COUNT = Path("/proc/sys/vm/max_map_count")
OWN_MAPS = Path("/proc/self/maps")
# Stop warming up with this share of the cap still free: programs compiled later (sampling
# variants, new shapes) and other libraries need regions too.
RESERVE = 0.25
# Below this share of the cap free, engines drop the compiled programs before their next step.
# One step program takes a few hundred regions, so a tenth of the default cap leaves room for
# the program that step may compile and the small ones loading a model does.
RELEASE_BELOW = 0.10
# JAX records this after compiling a program or loading it from the persistent cache.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def map_headroom() -> int | None:
    """Regions this process may still map before the kernel's cap, or None where unknown (not Linux)."""
    try:
        limit = int(MAX_MAP_COUNT.read_text())
        with OWN_MAPS.open() as maps:
            used = sum(1 for _ in maps)
    except (OSError, ValueError):
        return None
    return limit - used


def warmup_may_continue(per_program: float) -> bool:
    """True while compiling one more program leaves RESERVE of the cap free (always True where unknown)."""
    headroom = map_headroom()
    if headroom is None:
        return True
    limit = int(MAX_MAP_COUNT.read_text())
    return headroom - per_program > RESERVE * limit


class ProgramHolder(Protocol):
    def clear(self) -> None: ...


_HOLDERS: weakref.WeakSet = weakref.WeakSet()  # what keeps compiled programs besides jax's caches


def hold_programs(holder: ProgramHolder) -> None:
    """Have `drop_compiled_programs` clear holder too (kept only while something else refers to it)."""
    _HOLDERS.add(holder)


def drop_compiled_programs() -> None:
    """Drop every compiled program of the process: jax's caches and every holder's (e.g. runners' tables)."""
    jax.clear_caches()
    for holder in list(_HOLDERS):
        holder.clear()


class _CompileCount:
    """Programs compiled or loaded in this process, counted from JAX's monitoring events."""

    total = 0
    checked = -1  # `total` at the last look at the maps
    listening = False


def _count_compile(event: str, duration: float, **kwargs: object) -> None:
    if event == COMPILE_EVENT:
        _CompileCount.total += 1


def count_loaded() -> None:
    """Count a program loaded without jax's compile path (runtime/program_store), as jax counts its cache's."""
    watch_compiles()
    _CompileCount.total += 1


def watch_compiles() -> None:
    """Start counting compiled programs (once per process)."""
    if not _CompileCount.listening:
        jax.monitoring.register_event_duration_secs_listener(_count_compile)
        _CompileCount.listening = True


def compile_count() -> int:
    """Programs compiled or loaded from the persistent cache in this process since the count began (the
    first model load or engine step): a server that still compiles after its warm-up shows it here."""
    watch_compiles()
    return _CompileCount.total


def device_bytes_in_use() -> int | None:
    """Bytes JAX's allocators hold on this process's devices, or None where they report nothing (CPU)."""
    stats = [device.memory_stats() for device in jax.local_devices()]
    if not all(stats):
        return None
    return sum(int(s.get("bytes_in_use", 0)) for s in stats)


def release_programs_near_cap() -> bool:
    """On CPU, drop every compiled program of the process (`drop_compiled_programs`) when fewer than
    RELEASE_BELOW of the cap's regions are free; True when it did.

    The maps are read only when programs were compiled since the last look (reading 60k lines
    takes milliseconds; this runs before every engine step).
    """
    watch_compiles()
    if _CompileCount.total == _CompileCount.checked:
        return False
    _CompileCount.checked = _CompileCount.total
    if jax.default_backend() != "cpu":  # other backends' programs hold no host code
        return False
    headroom = map_headroom()
    if headroom is None:
        return False
    limit = int(MAX_MAP_COUNT.read_text())
    if headroom >= RELEASE_BELOW * limit:
        return False
    log.warning(
        "this process maps %d of the %d memory regions vm.max_map_count allows (XLA:CPU maps every compiled "
        "kernel): dropping all compiled programs, which load again from the compilation cache or recompile when "
        "next used. Raise the cap (sudo sysctl -w vm.max_map_count=262144) or hold fewer models in one process",
        limit - headroom, limit,
    )
    drop_compiled_programs()
    return True
