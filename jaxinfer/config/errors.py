"""Errors a user fixes by changing what they pass; ValueErrors, so `except ValueError` catches them.

Kept apart from `checkpoint.py` so the light modules (validation, config) raise them without
importing jax.
"""

from __future__ import annotations


class CheckpointError(ValueError):
    """A model directory or weights file jaxinfer cannot load; the message names the path and what is expected."""


class ConfigError(ValueError):
    """A model configuration jaxinfer cannot run; the message says what is supported."""
