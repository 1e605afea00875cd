"""A model's `generation_config.json`: extra stop ids and default sampling settings.

Read as defaults, as vLLM does: EOS ids listed there (Llama 3's `<|eot_id|>`) join the ones
in `config.json`, and the sampling fields become the `SamplingParams` used when a call passes
none. `do_sample` is ignored (vLLM ignores it too): a listed temperature is taken as meant.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

FILENAME = "generation_config.json"
# generation_config.json key -> SamplingParams field.
SAMPLING_FIELDS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


@dataclasses.dataclass(frozen=True)
class GenerationDefaults:
    """EOS ids and SamplingParams field overrides a model ships with."""

    eos_token_ids: tuple[int, ...] = ()
    sampling: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def token_ids(value: Any) -> tuple[int, ...]:
    """An HF token-id field (None, one int or a list) as a tuple."""
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))


def merge_ids(first: tuple[int, ...], second: tuple[int, ...]) -> tuple[int, ...]:
    """Both id tuples, first's order kept, duplicates dropped."""
    return tuple(dict.fromkeys(first + second))


def from_dict(raw: Mapping[str, Any]) -> GenerationDefaults:
    """GenerationDefaults from a parsed generation_config.json; null entries mean unset."""
    sampling = {field: raw[key] for key, field in SAMPLING_FIELDS.items() if raw.get(key) is not None}
    return GenerationDefaults(token_ids(raw.get("eos_token_id")), sampling)


def generation_defaults(model_dir: str | Path) -> GenerationDefaults:
    """The defaults in `model_dir`/generation_config.json (empty when the file is absent)."""
    path = Path(model_dir) / FILENAME
    if not path.is_file():
        return GenerationDefaults()
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    return from_dict(raw)
