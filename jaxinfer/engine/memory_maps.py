"""Memory-map headroom of this process (Linux): XLA:CPU's JIT maps every compiled kernel separately.

Each CPU program maps its kernels' code and data as separate small regions (about 260 per
step program of the 6-layer demo model, 310 for a 30-layer model), and Linux caps a process
at `vm.max_map_count` regions (65530 by default). Past the cap the JIT's next allocation
fails and the process crashes, so warm-up stops before it and says how to raise the cap.
"""

from __future__ import annotations

from pathlib import Path

MAX_MAP_COUNT = Path("/proc/sys/vm/max_map_count")
OWN_MAPS = Path("/proc/self/maps")
# Stop warming up with this share of the cap still free: programs compiled later (sampling
# variants, new shapes) and other libraries need regions too.
RESERVE = 0.25


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
