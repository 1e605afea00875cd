"""Speculative decoding: proposers, exact rejection sampling and the on-device draft-verify loop.

Names are imported on first use, so that host-only modules (`acceptance_summary`) load without jax.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SpeculativeConfig", "AcceptanceRule", "EXACT_RULE"]


def __getattr__(name: str) -> Any:
    if name == "SpeculativeConfig":
        from jaxinfer.speculative.config import SpeculativeConfig

        return SpeculativeConfig
    if name in ("AcceptanceRule", "EXACT_RULE"):
        from jaxinfer.speculative import rejection

        return getattr(rejection, name)
    raise AttributeError(f"module 'jaxinfer.speculative' has no attribute {name!r}")
