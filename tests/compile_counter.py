"""Counting compiles: JAX's `backend_compile_duration` events (a compile and a load from the
persistent cache alike), the listener `runtime.memory_maps` already uses."""

from __future__ import annotations

import jax

from jaxinfer.runtime.memory_maps import COMPILE_EVENT


class CompileCounter:
    """Compile events while active (a listener cannot be removed: it checks a flag)."""

    def __init__(self) -> None:
        self.active, self.count = False, 0
        jax.monitoring.register_event_duration_secs_listener(self._heard)

    def _heard(self, event: str, duration: float, **kwargs: object) -> None:
        if self.active and event == COMPILE_EVENT:
            self.count += 1
