"""The test session's XLA:CPU compile level, and the user's own flags for what must run as users run it.

A session on a new machine compiles every step program once (its persistent compilation cache
is empty): 940 s for the suite on 2 cores, against 260 s warm. LLVM's optimisations are about a
third of that compile time, and the tiny test models barely use the code they speed up (the
native kernels are built with their own flags), so the session compiles at -O0 (the cold suite:
940 -> 680-780 s). Code generated at -O0 rounds some float operations differently (no fused
multiply-adds), by a few ulps: every comparison in the suite is within one session, or within
tolerances. The docs examples run with the user's flags (`user_xla_flags`), so what users run
stays covered at the default level.
"""

from __future__ import annotations

import importlib.util
import os

LEVEL_FLAG = "--xla_backend_optimization_level"
USER_FLAGS_VAR = "JAXINFER_TESTS_USER_XLA_FLAGS"  # set once, by the first process (pytest's controller)


def compile_tests_at_o0() -> None:
    """Add -O0 to XLA_FLAGS for this process and its children, on a CPU-only jax, unless already set.

    Must run before jax initialises a backend (XLA reads XLA_FLAGS once).
    """
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ.setdefault(USER_FLAGS_VAR, flags)
    accelerator = any(importlib.util.find_spec(name) for name in ("jax_plugins", "libtpu"))
    if LEVEL_FLAG not in flags and not accelerator:
        os.environ["XLA_FLAGS"] = f"{flags} {LEVEL_FLAG}=0".strip()


def user_xla_flags() -> str:
    """XLA_FLAGS as the session found them."""
    return os.environ.get(USER_FLAGS_VAR, os.environ.get("XLA_FLAGS", ""))
