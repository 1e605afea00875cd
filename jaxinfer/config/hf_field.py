"""Reading one value of an HF `config.json`: a key holding null counts as absent (exporters write both)."""

from __future__ import annotations

from typing import Any, Mapping


def field(hf: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """An HF config value; a key holding null counts as absent (exporters write both)."""
    value = hf.get(name)
    return default if value is None else value
