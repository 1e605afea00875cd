"""Test-only plugin for a `jaxinfer serve` child process: every engine step takes STEP_DELAY seconds
longer, so a test can signal the process while its requests are still generating.

Loaded by the child's own command line (`python -c "import slow_steps; ..."`), never by jaxinfer.
"""

from __future__ import annotations

import time

from jaxinfer.engine.engine import LLMEngine

STEP_DELAY = 0.1
_step = LLMEngine.step


def _slow_step(self, *args, **kwargs):
    time.sleep(STEP_DELAY)
    return _step(self, *args, **kwargs)


LLMEngine.step = _slow_step
