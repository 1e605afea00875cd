"""Rotary-embedding scaling: the dataclass every config holds, and its reading from transformers 5's
`rope_parameters` or 4's `rope_theta` / `rope_scaling`."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxinfer.config.errors import ConfigError
from jaxinfer.config.hf_field import field

ROPE_TYPES = ("default", "linear", "llama3", "longrope", "yarn", "proportional")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Rotary-embedding frequency scaling (HF `rope_parameters` / `rope_scaling`).

    longrope (Phi-3 "su"/"longrope"): per-frequency divisors `short_factor` and `long_factor`;
    `long` picks the long set, decided once for the context the model serves (see
    `models.rope.for_context`) so cached keys and new queries always agree.
    yarn: `factor` slows the frequencies of dims that turn fewer than `beta_slow` times over the original
    context, keeps those turning more than `beta_fast` times, ramps linearly between (whole dims unless
    `truncate` is false); cos and sin are scaled by `attention_factor`, or one inferred from `factor` and
    DeepSeek's `mscale` / `mscale_all_dim`.
    proportional (Gemma 4's global layers): the default rope over the whole head, its frequencies past the
    leading `rotated_fraction` zero (those dims pass through), all divided by `factor`.
    """

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float | None = None
    long: bool = False
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    rotated_fraction: float = 1.0  # proportional: transformers' partial_rotary_factor


def rope_fields(hf: Mapping[str, Any], params: Mapping[str, Any] | None = None) -> tuple[float, RopeScaling]:
    """Rope theta and scaling from transformers 5 (`rope_parameters`) or 4 (`rope_theta`, `rope_scaling`).

    `params` overrides where the parameters live (Gemma 3 keeps one set per layer type).
    """
    if params is None:
        params = dict(hf.get("rope_parameters") or {})
        params.update(hf.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    rope_type = "longrope" if rope_type == "su" else rope_type  # Phi-3's first name for it
    if rope_type not in ROPE_TYPES:
        raise ConfigError(f"rope type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
    kwargs = {k: v for k, v in params.items() if k in _SCALING_FIELDS}
    for name in ("short_factor", "long_factor"):
        if name in kwargs:
            kwargs[name] = tuple(float(f) for f in kwargs[name])
    if rope_type == "longrope":
        kwargs.setdefault("original_max_position_embeddings", int(field(hf, "original_max_position_embeddings", 4096)))
        if "factor" not in params:  # Phi-3 leaves it to max / original, as transformers does
            kwargs["factor"] = field(hf, "max_position_embeddings", 4096) / kwargs["original_max_position_embeddings"]
    if rope_type == "yarn":
        kwargs.update(_yarn_fields(hf, params))
    if rope_type == "proportional":
        kwargs["rotated_fraction"] = float(params.get("partial_rotary_factor", 1.0))
    if rope_type == "llama3":  # transformers' default: the model's own context
        kwargs.setdefault("original_max_position_embeddings", int(field(hf, "max_position_embeddings", 8192)))
    return theta, RopeScaling(rope_type=rope_type, **kwargs)


def _yarn_fields(hf: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """YaRN's parameters with the defaults transformers' `_compute_yarn_parameters` gives them.

    The original context comes from the top level first (transformers lets it override the rope
    parameters, for Phi-3-style configs), then the parameters, then max_position_embeddings; a null
    factor is their ratio (DeepSeek-V3); beta_fast / beta_slow are read with `or` and `truncate` by
    truth, as transformers does, so a null bound takes its default and a null truncate means false.
    """
    max_len = field(hf, "max_position_embeddings", 4096)
    original = field(params, "original_max_position_embeddings", max_len)
    original = int(field(hf, "original_max_position_embeddings", original))
    factor = params.get("factor")
    return dict(
        original_max_position_embeddings=original,
        factor=float(max_len / original if factor is None else factor),
        beta_fast=float(params.get("beta_fast") or 32),
        beta_slow=float(params.get("beta_slow") or 1),
        truncate=bool(params.get("truncate", True)),
    )


_SCALING_FIELDS = {f.name for f in dataclasses.fields(RopeScaling)} - {"rope_type", "long"}
