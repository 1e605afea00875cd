"""vLLM's `speculative_config` (a dict: `LLM(speculative_config={...})`, `serve --speculative-config '{...}'`)
read into a SpeculativeConfig, so a vLLM user's settings run here as written.

vLLM's keys map to this engine's fields (`model` -> draft_model, `prompt_lookup_max` -> ngram_max,
`suffix_decoding_*` -> suffix_*); this engine's own field names are accepted too. Keys that would change
what vLLM does but have no meaning here (a draft's own tensor parallelism, quantization, revision) are
accepted only at the value that changes nothing, and refused by name otherwise: settings are never dropped.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxinfer.speculative.config import SpeculativeConfig

RENAMED = {  # vLLM's key -> SpeculativeConfig's field
    "model": "draft_model",
    "prompt_lookup_max": "ngram_max",
    "prompt_lookup_min": "ngram_min",
    "suffix_decoding_max_tree_depth": "suffix_max_depth",
    "suffix_decoding_max_cached_requests": "suffix_max_cached_requests",
    "suffix_decoding_max_spec_factor": "suffix_max_spec_factor",
    "suffix_decoding_min_token_prob": "suffix_min_token_prob",
}
METHODS = {"draft_model": "draft", "eagle3": "eagle"}  # vLLM's method -> this engine's ("*_mtp" -> "mtp")
INERT = {  # vLLM's key -> the values that change nothing here, and why others cannot be served
    "draft_tensor_parallel_size": ((None, 1), "the draft runs on the target's devices and mesh"),
    "quantization": ((None,), "the draft is loaded in the target's dtype, unquantized"),
    "revision": ((None,), "a draft is a local directory; there is no hub to take a revision from"),
    "code_revision": ((None,), "a draft is a local directory; there is no hub to take a revision from"),
}
FIELDS = tuple(f.name for f in dataclasses.fields(SpeculativeConfig) if f.name != "rule")


def from_vllm(settings: Mapping[str, Any] | SpeculativeConfig, where: str = "speculative_config") -> SpeculativeConfig:
    """A SpeculativeConfig from vLLM's dict (or this engine's field names; a SpeculativeConfig as it is);
    ValueError naming `where`, the key and what is accepted for anything that cannot be served."""
    if isinstance(settings, SpeculativeConfig):
        return settings
    if not isinstance(settings, Mapping):
        raise TypeError(f"{where} must be a dict of vLLM's speculative_config keys or a SpeculativeConfig, "
                        f"got {type(settings).__name__}")
    fields: dict[str, Any] = {}
    given: dict[str, str] = {}  # field -> the key that set it
    for key, value in settings.items():
        if key in INERT:
            _check_inert(where, key, value)
        if key in INERT or key == "method":
            continue
        field = RENAMED.get(key, key)
        if field not in FIELDS:
            raise ValueError(f"{where}: unknown key {key!r}; accepted: {', '.join(_accepted())}")
        if field in fields and fields[field] != value:
            raise ValueError(f"{where}: {key}={value!r} and {given[field]}={fields[field]!r} are one setting "
                             "under two names; give one of them")
        fields[field], given[field] = value, key
    fields["method"] = _method(where, settings.get("method"), fields.get("draft_model"))
    try:
        return SpeculativeConfig(**fields)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def _method(where: str, method: Any, model: Any) -> str:
    """This engine's method for vLLM's; without one, vLLM's guess from the draft's name (an EAGLE head's
    name says so, another model is a draft model)."""
    if method is None:
        if model is None:
            raise ValueError(f"{where}: give a 'method' (ngram, suffix, draft_model, eagle, eagle3, mtp, ...) "
                             "or a draft 'model'")
        return "eagle" if "eagle" in str(model).lower() else "draft"
    if not isinstance(method, str):
        raise ValueError(f"{where}: method must be a string, got {method!r}")
    return "mtp" if method.endswith("_mtp") else METHODS.get(method, method)


def _check_inert(where: str, key: str, value: Any) -> None:
    values, why = INERT[key]
    if value not in values:
        accepted = " or ".join(repr(v) for v in values)
        raise ValueError(f"{where}: {key}={value!r} is not served ({why}); accepted: {accepted}")


def _accepted() -> list[str]:
    return sorted({*RENAMED, *INERT, *FIELDS})


def speculative_setting(speculative: Any, speculative_config: Any) -> SpeculativeConfig | None:
    """`LLM(speculative=...)`, or vLLM's name for it, speculative_config; each a SpeculativeConfig or a dict
    (`from_vllm`); both given is an error, as they are one setting."""
    if speculative is not None and speculative_config is not None:
        raise ValueError("speculative and speculative_config are one setting (speculative_config is vLLM's name "
                         "for it); give one of them")
    if speculative_config is not None:
        return from_vllm(speculative_config, "speculative_config")
    return None if speculative is None else from_vllm(speculative, "speculative")
