"""The serving engine: continuous batching over the paged KV cache (see engine.engine).

Names are imported on first use, so that the host-only modules (requests, block manager,
scheduler, outputs) load without jax.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "AsyncLLMEngine": "jaxinfer.engine.async_engine",
    "EngineConfig": "jaxinfer.config.engine",
    "LLMEngine": "jaxinfer.engine.engine",
    "CompletionOutput": "jaxinfer.engine.outputs",
    "RequestMetrics": "jaxinfer.engine.outputs",
    "RequestOutput": "jaxinfer.engine.outputs",
}
__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'jaxinfer.engine' has no attribute {name!r}")
