"""Reusable argument checks: each names the field, the value given and what is accepted."""

from __future__ import annotations

import math
import re
from numbers import Integral, Real
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from jaxinfer.config.errors import CheckpointError

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name, as the Hugging Face Hub spells repos
INT32_LIMIT = 2**31  # token ids and top_k live in int32 device arrays
DTYPE_NAMES = ("float32", "bfloat16", "float16")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _show(value: Any) -> str:
    """A short repr for messages (a 10,000-token prompt is not echoed in full)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def integer(value: Any, field: str, low: int | None = None, high: int | None = None, hint: str = "") -> int:
    """`value` as an int in [low, high]; floats, bools and strings are a TypeError."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{field} must be an integer, got {_show(value)} ({type(value).__name__}){_hint(hint)}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{field} must be an integer {_bounds(low, high)}, got {value}{_hint(hint)}")
    return value


def _bounds(low: float | None, high: float | None) -> str:
    if high is None:
        return f">= {_num(low)}"
    if low is None:
        return f"<= {_num(high)}"
    return f"in [{_num(low)}, {_num(high)}]"


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _hint(hint: str) -> str:
    return f"; {hint}" if hint else ""


def positive_int(value: Any, field: str, high: int | None = None, hint: str = "") -> int:
    """`value` as an int >= 1 (and <= high when given)."""
    return integer(value, field, 1, high, hint)


def optional_int(value: Any, field: str, low: int | None = None, high: int | None = None) -> int | None:
    """None, or an int in [low, high]."""
    return None if value is None else integer(value, field, low, high)


def number(value: Any, field: str, low: float | None = None, high: float | None = None, hint: str = "") -> float:
    """`value` as a finite float in [low, high]; strings, bools, nan and inf are rejected."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{field} must be a number, got {_show(value)} ({type(value).__name__}){_hint(hint)}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{field} must be a finite number, got {value}{_hint(hint)}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{field} must be {_bounds(low, high)}, got {_num(value)}{_hint(hint)}")
    return value


def boolean(value: Any, field: str) -> bool:
    """`value` if it is a bool (numpy bools too)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{field} must be True or False, got {_show(value)} ({type(value).__name__})")
    return bool(value)


def token_ids(value: Any, field: str, vocab_size: int | None = None) -> list[int]:
    """A list of int token ids, each in [0, vocab_size) (or [0, 2**31) when the vocabulary is unknown)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(
            f"{field} must be a list of int token ids, got {_show(value)} ({type(value).__name__})"
            + ("; encode text with llm.tokenize(text) first" if isinstance(value, (str, bytes)) else "")
        )
    limit = INT32_LIMIT if vocab_size is None else vocab_size
    if all(type(t) is int for t in value):  # plain ints (no bools): no per-id call and message built
        ids = list(value)
    else:
        ids = [integer(t, f"{field}[{i}]") for i, t in enumerate(value)]
    bad = [t for t in ids if not 0 <= t < limit]
    if bad:
        where = "the vocabulary" if vocab_size is not None else "int32 token ids"
        raise ValueError(f"{field} has ids {bad[:5]} outside {where} [0, {limit})")
    return ids


def prompts(value: Any, field: str = "prompts", vocab_size: int | None = None) -> list[str | list[int]]:
    """One prompt or many -> a list of prompts, each a str or a list of token ids in the vocabulary."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, str):
        return [value]
    if isinstance(value, bytes) or not isinstance(value, Sequence):
        raise TypeError(
            f"{field} must be a str, a list of int token ids, or a list of those, "
            f"got {_show(value)} ({type(value).__name__})"
        )
    if value and isinstance(value[0], Integral) and not isinstance(value[0], bool):
        return [token_ids(value, field, vocab_size)]
    return [_one_prompt(p, f"{field}[{i}]", vocab_size) for i, p in enumerate(value)]


def single_prompt(value: Any, field: str, method: str, vocab_size: int | None = None) -> str | list[int]:
    """One prompt (a str or a list of token ids) for `method`; several prompts are an error pointing to generate."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and value and \
            isinstance(value[0], (str, Sequence)):
        raise TypeError(f"{method} takes one prompt (a str or a list of int token ids), got a list of {len(value)} "
                        f"prompts; use generate(prompts) for several (or call {method} once per prompt)")
    (prompt,) = prompts(value, field, vocab_size)
    return prompt


def _one_prompt(value: Any, field: str, vocab_size: int | None) -> str | list[int]:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, Integral)) or not isinstance(value, (Sequence, np.ndarray)):
        raise TypeError(f"{field} must be a str or a list of int token ids, got {_show(value)} ({type(value).__name__})")
    return token_ids(value, field, vocab_size)


def dtype_name(value: Any, field: str = "dtype", allow_auto: bool = True) -> str:
    """A canonical dtype name ("float32", "bfloat16", "float16", or "auto"); aliases like bf16 accepted."""
    accepted = (("auto",) if allow_auto else ()) + DTYPE_NAMES + tuple(DTYPE_ALIASES)
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a string, one of {', '.join(accepted)}; got {_show(value)}")
    name = DTYPE_ALIASES.get(value.lower(), value.lower())
    if name == "int8":
        raise ValueError(
            f"{field} 'int8' is not supported yet (weights are stored in float); "
            f"use one of {', '.join(accepted)}"
        )
    if name not in DTYPE_NAMES and not (allow_auto and name == "auto"):
        raise ValueError(f"{field} {value!r} is not supported; use one of {', '.join(accepted)}")
    return name


def model_dir(value: Any, field: str = "model") -> Path:
    """An existing directory holding a config.json (an HF checkpoint or a converted model)."""
    if not isinstance(value, (str, Path)):
        raise TypeError(f"{field} must be a directory path (str or Path), got {_show(value)} ({type(value).__name__})")
    path = Path(value)
    if path.is_file():
        raise CheckpointError(f"{field}: {path} is a file; give the model directory, which holds config.json and "
                              f"the weights{_parent_hint(path)}")
    if not path.is_dir():
        raise CheckpointError(_missing_model(value, path, field))
    if not (path / "config.json").is_file():
        raise CheckpointError(
            f"{field}: {path} is not a model directory (no config.json); give an HF checkpoint "
            "directory or one written by `jaxinfer convert`"
        )
    return path


def _parent_hint(path: Path) -> str:
    """Where the model probably is when a file inside it was given (its config.json, its weights)."""
    return f" (here probably {path.parent})" if (path.parent / "config.json").is_file() else ""


def _missing_model(value: str | Path, path: Path, field: str) -> str:
    """The message for a path that does not exist; one shaped like a Hub id says how to download it."""
    if isinstance(value, str) and HUB_ID.fullmatch(value):
        # jaxinfer never downloads; `hf` replaced `huggingface-cli` in huggingface_hub 1.0.
        return (f"{field} {value!r} is not a local directory; jaxinfer loads local checkpoints only, so for a "
                f"Hugging Face Hub id download it first: `huggingface-cli download {value} --local-dir DIR` "
                f"(`hf download` with huggingface_hub >= 1.0), then pass DIR")
    return f"{field} directory {path} does not exist"
