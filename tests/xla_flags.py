"""The test session's XLA:CPU compile settings, and the user's own flags for what must run as users run it.

A session on a new machine compiles every step program once (its persistent compilation cache
is empty), and compiling was half of such a session's time. These XLA:CPU settings cut it
without touching what the tests check:

- `-O0`: LLVM's optimisations, which the tiny test models barely use (the native kernels are built
  with their own flags). A tiny engine's warm-up compiles in 33 s of CPU instead of 51.
- the classic fusion emitters instead of XLA:CPU's newer MLIR ones, Eigen's dots instead of
  XNNPACK's, one LLVM module per program: 33 s -> 7-8 s more, the same tokens
  (`tests/compile_log.py` finds where a session's compile time goes).

Code generated this way rounds some float operations differently (no fused multiply-adds), by a
few ulps: every comparison in the suite is within one session, or within tolerances. The README's
examples, batch invariance (bitwise, so it depends on where the compiler contracts a multiply and
an add) and the tests that measure compiling run with the user's flags (`user_xla_flags`), so what
users run stays covered as they run it.
"""

from __future__ import annotations

import importlib.util
import os

TEST_FLAGS = {
    "--xla_backend_optimization_level": "0",
    "--xla_cpu_use_fusion_emitters": "false",
    "--xla_cpu_use_xnnpack": "false",
    "--xla_cpu_parallel_codegen_split_count": "1",  # two workers on two cores: splitting only adds work
}
USER_FLAGS_VAR = "JAXINFER_TESTS_USER_XLA_FLAGS"  # set once, by the first process (pytest's controller)


def compile_tests_fast() -> None:
    """Add TEST_FLAGS to XLA_FLAGS for this process and its children, on a CPU-only jax, each unless
    already set. Must run before jax initialises a backend (XLA reads XLA_FLAGS once)."""
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ.setdefault(USER_FLAGS_VAR, flags)
    if any(importlib.util.find_spec(name) for name in ("jax_plugins", "libtpu")):
        return
    added = [f"{name}={value}" for name, value in TEST_FLAGS.items() if name not in flags]
    os.environ["XLA_FLAGS"] = " ".join([flags, *added]).strip()


def user_xla_flags() -> str:
    """XLA_FLAGS as the session found them."""
    return os.environ.get(USER_FLAGS_VAR, os.environ.get("XLA_FLAGS", ""))
