"""The two configurations of a comparison: `LLM` keyword sets, parsed from `key=value,...` text or given as dicts."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any, Mapping

from jaxinfer.entrypoints.llm import DEMO_DRAFT, DEMO_EAGLE, LLM
from jaxinfer.speculative.config import METHODS, MODEL_FREE, SpeculativeConfig

HF_REFERENCE = "hf"  # `--reference hf`: HF transformers (PyTorch) on A's checkpoint
# The demo's own draft model and EAGLE head, so `speculative=draft:demo` needs no path.
DEMO_DRAFTS = {"draft": DEMO_DRAFT, "eagle": DEMO_EAGLE}
SPECULATIVE_SHAPE = "ngram, ngram_device, suffix, draft:DIR, eagle:DIR, or draft:demo / eagle:demo for the demo model's own"


def accepted_keys() -> tuple[str, ...]:
    """LLM's keyword arguments, read from its signature so a new one is accepted without a change here."""
    return tuple(name for name in inspect.signature(LLM.__init__).parameters if name != "self")


@dataclasses.dataclass
class Configuration:
    """One side of a comparison: LLM keyword arguments, or HF transformers as the reference.

    `llm` may hold an LLM already built from exactly these kwargs (a notebook's, or a test's): it
    is used as is and left open; otherwise the comparison loads one and frees it afterwards.
    """

    kwargs: dict[str, Any]
    label: str = ""
    llm: LLM | None = None
    reference: str | None = None  # "hf" for the HF transformers reference

    def __post_init__(self) -> None:
        check_keys(self.kwargs, self.label or "configuration")

    def describe(self) -> dict[str, str]:
        """The kwargs as strings (JSON and the report); the HF reference names itself."""
        if self.reference is not None:
            return {"reference": "HF transformers (PyTorch) on A's checkpoint and dtype"}
        return {key: show(value) for key, value in self.kwargs.items()}


def show(value: Any) -> str:
    """A kwarg value as the report shows it (a SpeculativeConfig by its method and draft)."""
    if isinstance(value, SpeculativeConfig):
        return value.method if value.draft_model is None else f"{value.method}:{value.draft_model}"
    return str(value)


def check_keys(kwargs: Mapping[str, Any], where: str) -> None:
    """A ValueError naming the first key LLM does not take, with the ones it does."""
    accepted = accepted_keys()
    for key in kwargs:
        if key not in accepted:
            raise ValueError(f"{where}: unknown key {key!r}; accepted keys (LLM's keyword arguments): "
                             f"{', '.join(accepted)}")


def parse_value(key: str, text: str) -> Any:
    """A value from text: true/false, none, an int, a float, else the string (speculative: a config)."""
    if key == "speculative":
        return parse_speculative(text)
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip()


def parse_speculative(text: str) -> SpeculativeConfig | None:
    """`ngram`, `suffix`, `draft:DIR`, `eagle:DIR` (`demo` for the demo's own) or `none` as a SpeculativeConfig."""
    method, _, draft = text.strip().partition(":")
    if method.lower() in ("none", "null", ""):
        return None
    if method not in METHODS or (method in MODEL_FREE) != (not draft):
        raise ValueError(f"speculative={text!r} is not one of: {SPECULATIVE_SHAPE}")
    if method in MODEL_FREE:
        return SpeculativeConfig(method=method)
    path = DEMO_DRAFTS[method] if draft == "demo" else Path(draft)
    return SpeculativeConfig(method=method, draft_model=str(path))


def parse_configuration(spec: str | Mapping[str, Any] | Configuration | LLM | None, label: str) -> Configuration:
    """A Configuration from `key=value,...` text (empty: LLM's defaults), a kwargs dict, "hf", or itself."""
    if isinstance(spec, Configuration):
        return spec if spec.label else dataclasses.replace(spec, label=label)
    if isinstance(spec, LLM):
        raise TypeError(f"{label}: pass an LLM as Configuration(kwargs, llm=...) with the kwargs it was built "
                        "with, so the verdicts know what changed")
    if spec is None:
        return Configuration({}, label)
    if isinstance(spec, Mapping):
        return Configuration(dict(spec), label)
    if not isinstance(spec, str):
        raise TypeError(f"{label}: expected 'key=value,...' text, a dict of LLM kwargs or a Configuration, "
                        f"got {type(spec).__name__}")
    if spec.strip().lower() == HF_REFERENCE:
        return Configuration({}, label, reference=HF_REFERENCE)
    return Configuration(parse_pairs(spec, label), label)


def parse_pairs(text: str, label: str) -> dict[str, Any]:
    """`key=value,key=value` as a dict; every malformed or unknown piece is a ValueError naming it."""
    kwargs: dict[str, Any] = {}
    for piece in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = piece.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"{label}: {piece!r} is not key=value (e.g. dtype=bfloat16,quantization=int8)")
        check_keys({key: None}, label)
        if key in kwargs:
            raise ValueError(f"{label}: key {key!r} is given twice")
        kwargs[key] = parse_value(key, value)
    return kwargs


def changed_keys(a: Configuration, b: Configuration) -> dict[str, tuple[Any, Any]]:
    """Keys whose values differ between A and B (absent: LLM's default), as (A's, B's)."""
    defaults = {name: p.default for name, p in inspect.signature(LLM.__init__).parameters.items() if name != "self"}
    keys = sorted(set(a.kwargs) | set(b.kwargs))
    pairs = {key: (a.kwargs.get(key, defaults.get(key)), b.kwargs.get(key, defaults.get(key))) for key in keys}
    return {key: pair for key, pair in pairs.items() if pair[0] != pair[1]}
