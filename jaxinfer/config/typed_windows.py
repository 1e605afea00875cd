"""Per-layer attention windows from each layer's type (transformers' `layer_types`)."""

from __future__ import annotations

from collections.abc import Sequence

from jaxinfer.config.model import ConfigError


def windows_by_type(kinds: Sequence[str], window: int, arch: str) -> tuple[int, ...]:
    """`window` for each "sliding_attention" layer, 0 (full) for the others; a window below 1 refused by name
    where some layer slides."""
    if window < 1 and "sliding_attention" in kinds:
        raise ConfigError(f"sliding_window {window} must be >= 1 for {arch}'s sliding layers")
    return tuple(window if kind == "sliding_attention" else 0 for kind in kinds)
