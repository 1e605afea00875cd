"""transformers imported without its import-time PyTorch advisory: jaxinfer uses only its tokenizers."""

from __future__ import annotations

import os
import sys
from typing import Any

ADVISORY_ENV = "TRANSFORMERS_NO_ADVISORY_WARNINGS"


def auto_tokenizer() -> Any:
    """transformers.AutoTokenizer; the first import runs with advisories off, then the env is restored."""
    if "transformers" in sys.modules:
        from transformers import AutoTokenizer

        return AutoTokenizer
    previous = os.environ.get(ADVISORY_ENV)
    os.environ[ADVISORY_ENV] = "1"  # read while transformers/__init__ runs, not later
    try:
        from transformers import AutoTokenizer
    finally:
        if previous is None:
            del os.environ[ADVISORY_ENV]
        else:
            os.environ[ADVISORY_ENV] = previous
    return AutoTokenizer
