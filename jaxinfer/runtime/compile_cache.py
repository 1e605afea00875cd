"""JAX's persistent compilation cache, on by default in the user's cache directory.

A fresh process otherwise recompiles every prefill and decode program (seconds each on a
GPU for a 1B model); with the cache it loads them from disk. `LLM` turns it on unless told not
to (argument or `JAXINFER_COMPILE_CACHE=0`). A cache directory the user already configured
for JAX (`JAX_COMPILATION_CACHE_DIR`) is kept as it is.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

ENV_SWITCH = "JAXINFER_COMPILE_CACHE"
OFF_VALUES = ("0", "false", "no", "off")
# JAX caches only programs that took >= 1 s to compile by default; the many small programs of
# a CPU run add up to more than the big ones, and loading a cached one is ~1 ms.
MIN_COMPILE_TIME_SECS = 0.0
MIN_ENTRY_SIZE_BYTES = 0


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/jaxinfer/xla, or ~/.cache/jaxinfer/xla."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "jaxinfer" / "xla"


def cache_requested(enabled: bool | None = None) -> bool:
    """An explicit argument wins; else JAXINFER_COMPILE_CACHE (off for 0/false/no/off); else on."""
    if enabled is not None:
        return enabled
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in OFF_VALUES


def enable_compile_cache(path: str | Path | None = None, enabled: bool | None = None) -> Path | None:
    """Point JAX's persistent compilation cache at `path` (default: the user's cache directory).

    Returns the directory in use, or None when the cache stays off. Call before the first
    compilation: JAX opens the cache once per process.
    """
    if not cache_requested(enabled):
        return None
    configured = jax.config.jax_compilation_cache_dir
    if path is None and configured:
        return Path(configured)
    directory = Path(path) if path is not None else default_cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # a read-only home must not stop the model from loading
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_SECS)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", MIN_ENTRY_SIZE_BYTES)
    return directory


def compile_cache_setting(setting: bool | str | Path | None) -> Path | None:
    """`LLM(compile_cache=...)`: None -> on unless the environment says off, bool -> that, a path -> there."""
    if isinstance(setting, (str, Path)):
        return enable_compile_cache(setting, enabled=True)
    return enable_compile_cache(None, enabled=setting)
