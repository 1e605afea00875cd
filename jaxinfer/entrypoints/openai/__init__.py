"""OpenAI-compatible HTTP server (`pip install jaxinfer[serve]`): `build_app(llm, ServerConfig(...))`.

Imported lazily so that `jaxinfer --help` works without the serve extra installed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ServerConfig", "build_app"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from jaxinfer.entrypoints.openai import app

        return getattr(app, name)
    raise AttributeError(f"module 'jaxinfer.entrypoints.openai' has no attribute {name!r}")
