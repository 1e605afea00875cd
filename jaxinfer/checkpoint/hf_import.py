"""transformers imported without its import-time PyTorch advisory: jaxinfer uses only its tokenizers."""

from __future__ import annotations

import os
import sys
from typing import Any

ADVISORY_ENV = "TRANSFORMERS_NO_ADVISORY_WARNINGS"


def auto_tokenizer() -> Any:
    """transformers.AutoTokenizer (see `tokenizer_class`)."""
    return tokenizer_class("AutoTokenizer")


def tokenizer_class(name: str) -> Any:
    """A tokenizer class of transformers by name; the first import runs with advisories off, then the
    env is restored. Only the class's own module is imported (transformers imports lazily)."""
    import importlib

    if "transformers" in sys.modules:
        return getattr(importlib.import_module("transformers"), name)
    previous = os.environ.get(ADVISORY_ENV)
    os.environ[ADVISORY_ENV] = "1"  # read while transformers/__init__ runs, not later
    try:
        return getattr(importlib.import_module("transformers"), name)
    finally:
        if previous is None:
            del os.environ[ADVISORY_ENV]
        else:
            os.environ[ADVISORY_ENV] = previous
