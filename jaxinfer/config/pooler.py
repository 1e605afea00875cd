"""Pooling settings of embedding models (vLLM's `runner="pooling"`): how a prompt's final hidden states
become its one vector, and which vector lengths a request may ask for. No jax.

Where the settings come from, the first that says: the user's `PoolerConfig` (vLLM's), the model
directory's sentence-transformers files (`modules.json`; its Pooling module's `config.json` for the
pooling type, a Normalize module for unit length), then vLLM's defaults: the last token's state for
decoder models, the first ([CLS]) for encoders, normalized. `config.json`'s `is_matryoshka` /
`matryoshka_dimensions` (vLLM's names, which its `hf_overrides` sets) say whether `dimensions` may
shorten the vector.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

from jaxinfer.config import validation
from jaxinfer.config.model import ConfigError

POOLING_TYPES = ("last", "mean", "cls")  # vLLM's LAST, MEAN and CLS
# sentence-transformers' Pooling settings -> the pooling type; the other modes (max, weighted mean, ...) are refused.
ST_POOLING_MODES = {
    "pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
}
ST_POOLING = "sentence_transformers.models.Pooling"
ST_NORMALIZE = "sentence_transformers.models.Normalize"


def check_pooling(pooling: Any, field: str = "pooling") -> str:
    """The pooling type in lower case; a ValueError naming the field when it is not one of POOLING_TYPES."""
    name = pooling.lower() if isinstance(pooling, str) else pooling
    if name not in POOLING_TYPES:
        raise ValueError(f"{field} must be one of {', '.join(POOLING_TYPES)} (any case), got {pooling!r}")
    return name


@dataclasses.dataclass(frozen=True)
class PoolerConfig:
    """vLLM's PoolerConfig: pooling_type "LAST", "MEAN" or "CLS" (any case) and normalize (unit length);
    a field left None takes the model directory's sentence-transformers setting, else LAST and True."""

    pooling_type: str | None = None
    normalize: bool | None = None

    def __post_init__(self) -> None:
        if self.pooling_type is not None:
            check_pooling(self.pooling_type, "pooler_config.pooling_type")
        if self.normalize is not None:
            validation.boolean(self.normalize, "pooler_config.normalize")

    @classmethod
    def of(cls, value: PoolerConfig | Mapping[str, Any] | None) -> PoolerConfig:
        """A PoolerConfig from itself, a dict of its fields (`--pooler-config`'s JSON) or None."""
        if value is None or isinstance(value, PoolerConfig):
            return value or cls()
        if not isinstance(value, Mapping):
            raise TypeError(f"pooler_config must be a PoolerConfig, a dict of its fields or None, got "
                            f"{type(value).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"pooler_config has unknown field(s) {unknown}; accepted: {', '.join(known)}")
        return cls(**value)


@dataclasses.dataclass(frozen=True)
class Pooler:
    """An embedding model's output: its pooling type, unit length or not, the hidden size, and the
    Matryoshka lengths a request may cut it to (`matryoshka`: any in [1, hidden_size], unless
    `matryoshka_dimensions` lists them)."""

    pooling: str
    normalize: bool
    hidden_size: int
    matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] | None = None

    def check_dimensions(self, dimensions: Any, field: str = "dimensions") -> int | None:
        """The vector length a request asks for (None: the whole hidden state); a ValueError naming the field,
        the value and what this model accepts."""
        if dimensions is None:
            return None
        dimensions = validation.integer(dimensions, field)
        if not self.matryoshka:
            raise ValueError(
                f"{field} {dimensions} is not supported by this model: it is not a Matryoshka model (its config.json "
                f"sets neither is_matryoshka nor matryoshka_dimensions), so its embeddings keep their "
                f"{self.hidden_size} dimensions; leave {field} out")
        if self.matryoshka_dimensions is not None and dimensions not in self.matryoshka_dimensions:
            raise ValueError(f"{field} must be one of this model's matryoshka_dimensions "
                             f"{list(self.matryoshka_dimensions)}, got {dimensions}")
        return validation.integer(dimensions, field, 1, self.hidden_size, "the model's hidden size is the most")


def resolve_pooler(model_dir: Path, hf: Mapping[str, Any], requested: PoolerConfig, hidden_size: int,
                   default: str = "last") -> Pooler:
    """The model's pooling settings: `requested`'s fields, else the sentence-transformers files', else the
    model's default pooling (LAST for decoders, CLS for encoders, as vLLM's) and normalized; Matryoshka
    lengths from config.json (`hf`)."""
    st_pooling, st_normalize = sentence_transformers_pooling(model_dir)
    pooling = requested.pooling_type or st_pooling or default
    normalize = next(v for v in (requested.normalize, st_normalize, True) if v is not None)
    matryoshka, dimensions = _matryoshka(hf, hidden_size, model_dir / "config.json")
    return Pooler(check_pooling(pooling), normalize, hidden_size, matryoshka, dimensions)


def sentence_transformers_pooling(model_dir: Path) -> tuple[str | None, bool | None]:
    """(pooling type, normalize) as a sentence-transformers directory's modules say; (None, None) without
    `modules.json`, and a pooling type of None when it has no Pooling module."""
    modules = _read_json(model_dir / "modules.json", list)
    if modules is None:
        return None, None
    types = {module.get("type"): module.get("path", "") for module in modules if isinstance(module, dict)}
    normalize = ST_NORMALIZE in types
    if ST_POOLING not in types:
        return None, normalize
    path = model_dir / types[ST_POOLING] / "config.json"
    settings = _read_json(path, dict) or {}
    chosen = [mode for mode, on in settings.items() if mode.startswith("pooling_mode_") and on is True]
    if len(chosen) != 1 or chosen[0] not in ST_POOLING_MODES:
        raise ConfigError(f"{path} turns on pooling modes {chosen}; jaxinfer pools with exactly one of "
                          f"{', '.join(ST_POOLING_MODES)} (or pass pooler_config / --pooler-config to choose)")
    return ST_POOLING_MODES[chosen[0]], normalize


def _matryoshka(hf: Mapping[str, Any], hidden_size: int, path: Path) -> tuple[bool, tuple[int, ...] | None]:
    """(is Matryoshka, the listed lengths or None) from config.json's vLLM fields."""
    listed = hf.get("matryoshka_dimensions")
    if listed is None:
        return bool(hf.get("is_matryoshka", False)), None
    if not isinstance(listed, list) or not all(isinstance(d, int) and 1 <= d <= hidden_size for d in listed):
        raise ConfigError(f"{path}: matryoshka_dimensions must be a list of lengths in [1, {hidden_size}] (the "
                          f"hidden size), got {listed!r}")
    return bool(listed), tuple(listed)


def _read_json(path: Path, kind: type) -> Any:
    """The parsed file, or None when absent; a ConfigError naming it when it is not JSON of `kind`."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path} is not valid JSON ({err}); expected a sentence-transformers file") from None
    if not isinstance(value, kind):
        raise ConfigError(f"{path} holds a JSON {type(value).__name__}; expected a {kind.__name__}")
    return value
