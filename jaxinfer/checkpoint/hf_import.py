"""transformers imported without its import-time PyTorch advisory: jaxinfer uses its tokenizers and processors."""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any

ADVISORY_ENV = "TRANSFORMERS_NO_ADVISORY_WARNINGS"
IMAGE_PROCESSING_AUTO = "transformers.models.auto.image_processing_auto"


def auto_tokenizer() -> Any:
    """transformers.AutoTokenizer (see `tokenizer_class`)."""
    return tokenizer_class("AutoTokenizer")


def auto_image_processor() -> Any:
    """transformers.AutoImageProcessor, read from its own module: transformers 5.17's lazy top level lists it as
    needing torchvision (its module names TorchvisionBackend) and hands out a stand-in raising ImportError where
    torchvision is absent, though the class itself falls back to the PIL processors."""
    return _module(IMAGE_PROCESSING_AUTO).AutoImageProcessor


def transformers_version() -> str:
    """The installed transformers' version, for messages about what it lacks."""
    return _module("transformers").__version__


def tokenizer_class(name: str) -> Any:
    """A tokenizer class of transformers by name. Only the class's own module is imported (transformers imports
    lazily)."""
    return getattr(_module("transformers"), name)


def _module(name: str) -> ModuleType:
    """A transformers module; transformers' first import runs with advisories off, then the env is restored."""
    import importlib

    if "transformers" in sys.modules:
        return importlib.import_module(name)
    previous = os.environ.get(ADVISORY_ENV)
    os.environ[ADVISORY_ENV] = "1"  # read while transformers/__init__ runs, not later
    try:
        return importlib.import_module(name)
    finally:
        if previous is None:
            del os.environ[ADVISORY_ENV]
        else:
            os.environ[ADVISORY_ENV] = previous
