"""Optional packages of `jaxinfer compare`: the `compare` extra (rich, plotly) and PyTorch for `--reference hf`."""

from __future__ import annotations

import importlib

COMPARE_EXTRA = ("rich", "plotly")
INSTALL = "pip install 'jaxinfer[compare]'"


class MissingDependency(ValueError):
    """An optional package a requested feature needs is not installed (the message says how to install it)."""


def require(*names: str) -> None:
    """MissingDependency naming every absent package of the `compare` extra and the install command."""
    missing = [name for name in names if not _importable(name)]
    if missing:
        raise MissingDependency(f"jaxinfer compare's report needs {' and '.join(missing)} (the 'compare' extra), "
                                f"not installed here; install it with: {INSTALL}")


def _importable(name: str) -> bool:
    """True when `import name` works (a broken or blocked install counts as missing)."""
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True
