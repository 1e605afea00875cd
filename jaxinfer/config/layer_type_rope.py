"""Rope settings per layer type: models whose sliding layers rotate with their own unscaled rope (Gemma 3,
OLMo 3, Gemma 4, MiMo-V2-Flash), read from transformers 5's per-layer-type `rope_parameters` or transformers 4's
separate fields."""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import LAYER_TYPES, ConfigError, RopeScaling, field, rope_fields


def layer_type_rope(
    hf: Mapping[str, Any], thetas: Mapping[str, float], local_key: str, arch: str,
) -> tuple[float, RopeScaling, float]:
    """(global theta, global scaling, local theta) of a model whose sliding layers rotate with their own
    unscaled rope (Gemma 3, OLMo 3): transformers 5's per-layer-type `rope_parameters`, or transformers 4's
    `rope_theta` / `rope_scaling` (the global layers') and `local_key` (the sliding layers' theta).

    thetas: transformers' default theta per layer type.
    """
    params = hf.get("rope_parameters") or {}
    if set(params) & set(LAYER_TYPES):
        full = {"rope_theta": thetas["full_attention"], **(params.get("full_attention") or {})}
        local = {"rope_theta": thetas["sliding_attention"], **(params.get("sliding_attention") or {})}
    else:
        full = {"rope_theta": field(hf, "rope_theta", thetas["full_attention"]), **(hf.get("rope_scaling") or {})}
        local = {"rope_theta": field(hf, local_key, thetas["sliding_attention"])}
    theta, scaling = rope_fields(hf, full)
    local_theta, local_scaling = rope_fields(hf, local)
    if local_scaling != RopeScaling():
        raise ConfigError(f"{arch} sliding layers' rope {local!r} is not supported; they take the default rope "
                          f"with their own rope_theta ({local_key})")
    return theta, scaling, local_theta
