"""Rotary position embeddings: frequency tables (default, linear, llama3, LongRoPE, YaRN, proportional) and
their use.

Tables are computed once per forward for each distinct (dims, theta, scaling) the layers use:
Gemma 3's sliding layers have their own base, so a forward may hold two (Gemma 4's also their own head dims).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config.model import ModelConfig, RopeScaling

CosSin = tuple[jax.Array, jax.Array]  # each [B, T, rotated dims], float32


def rope_inv_freq(dims: int, theta: float, scaling: RopeScaling) -> np.ndarray:
    """Inverse rotary frequencies [dims // 2] (float32) for `dims` rotated head dims."""
    exponents = np.arange(0, dims, 2, dtype=np.int64).astype(np.float32) / np.float32(dims)
    base = np.float32(theta) ** exponents
    if scaling.rope_type == "longrope":
        factors = scaling.long_factor if scaling.long else scaling.short_factor
        return (1.0 / (np.asarray(factors, np.float32) * base)).astype(np.float32)
    if scaling.rope_type == "yarn":
        return _yarn_inv_freq(base, dims, theta, scaling)
    inv_freq = (1.0 / base).astype(np.float32)
    if scaling.rope_type == "linear":
        return (inv_freq / np.float32(scaling.factor)).astype(np.float32)
    if scaling.rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    if scaling.rope_type == "proportional":
        return _proportional_inv_freq(inv_freq, scaling)
    return inv_freq


def _proportional_inv_freq(inv_freq: np.ndarray, s: RopeScaling) -> np.ndarray:
    """Gemma 4's proportional rope: the leading rotated_fraction of the frequencies (exponents over the whole
    head), the rest zero so their dims keep cos 1, sin 0; all divided by `factor` (transformers'
    `_compute_proportional_rope_parameters`)."""
    turned = int(s.rotated_fraction * len(inv_freq) * 2 // 2)
    kept = np.where(np.arange(len(inv_freq)) < turned, inv_freq, np.float32(0))
    return (kept / np.float32(s.factor)).astype(np.float32)


def _llama3_inv_freq(inv_freq: np.ndarray, s: RopeScaling) -> np.ndarray:
    """Llama 3.1 frequency scaling: long wavelengths slowed by `factor`, a smooth band between."""
    low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def _yarn_inv_freq(base: np.ndarray, dims: int, theta: float, s: RopeScaling) -> np.ndarray:
    """YaRN: frequencies divided by `factor` below the ramp, kept above it, blended linearly across it.

    The float32 operations follow transformers' order: from the same powers of theta, its table to the bit.
    """
    low, high = _yarn_correction_range(dims, theta, s)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = (np.arange(dims // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low)
    extrapolation = (1 - np.clip(ramp, 0, 1)).astype(np.float32)
    interpolated = (1.0 / (np.float32(s.factor) * base)).astype(np.float32)
    kept = (1.0 / base).astype(np.float32)
    return (interpolated * (1 - extrapolation) + kept * extrapolation).astype(np.float32)


def _yarn_correction_range(dims: int, theta: float, s: RopeScaling) -> tuple[float, float]:
    """The dims [low, high] between which YaRN's ramp runs, in float64 as transformers computes them."""
    low = _yarn_correction_dim(s.beta_fast, dims, theta, s.original_max_position_embeddings)
    high = _yarn_correction_dim(s.beta_slow, dims, theta, s.original_max_position_embeddings)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dims - 1)


def _yarn_correction_dim(rotations: float, dims: int, theta: float, context: int) -> float:
    """The dim whose wavelength fits `rotations` times into `context` positions (fractional)."""
    return (dims * math.log(context / (rotations * 2 * math.pi))) / (2 * math.log(theta))


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for a context stretched by `factor`."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def attention_factor(scaling: RopeScaling) -> float:
    """The factor cos and sin are multiplied by (LongRoPE's and YaRN's magnitude correction; 1 otherwise)."""
    if scaling.rope_type not in ("longrope", "yarn"):
        return 1.0
    if scaling.attention_factor is not None:
        return float(scaling.attention_factor)
    if scaling.rope_type == "yarn":
        if scaling.mscale and scaling.mscale_all_dim:  # DeepSeek: the ratio of two corrections
            return yarn_mscale(scaling.factor, scaling.mscale) / yarn_mscale(scaling.factor, scaling.mscale_all_dim)
        return yarn_mscale(scaling.factor)
    if scaling.factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(scaling.factor) / math.log(scaling.original_max_position_embeddings))


def cos_sin(positions: jax.Array, dims: int, theta: float, scaling: RopeScaling) -> CosSin:
    """cos, sin tables [*positions.shape, dims] in float32 for the given integer positions."""
    inv_freq = jnp.asarray(rope_inv_freq(dims, theta, scaling))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    factor = attention_factor(scaling)
    if factor == 1.0:
        return jnp.cos(emb), jnp.sin(emb)
    return jnp.cos(emb) * np.float32(factor), jnp.sin(emb) * np.float32(factor)


def mrope_owners(section: tuple[int, ...], interleaved: bool) -> np.ndarray:
    """The stream (0 temporal, 1 height, 2 width) turning each frequency: in sections one after another
    (Qwen2-VL), or t, h, w in turn while section[1] and section[2] last, temporal after (Qwen3-VL's layout)."""
    if not interleaved:
        return np.repeat(np.arange(len(section)), section)
    index = np.arange(sum(section))
    owner = np.zeros(len(index), np.int64)
    for stream in (1, 2):
        owner[(index % 3 == stream) & (index < 3 * section[stream])] = stream
    return owner


def mrope_cos_sin(streams: jax.Array, dims: int, theta: float, scaling: RopeScaling,
                  section: tuple[int, ...], interleaved: bool = False) -> CosSin:
    """Qwen2-VL's M-RoPE tables [B, T, dims]: frequency i turned by the (temporal, height, width) stream that
    owns it (`mrope_owners`); streams [3, B, T] integer positions (all equal for text: the one-stream tables)."""
    inv_freq = jnp.asarray(rope_inv_freq(dims, theta, scaling))
    freqs = streams.astype(jnp.float32)[..., None] * inv_freq  # [3, B, T, dims // 2]
    owner = mrope_owners(section, interleaved)
    picked = jnp.where(owner == 0, freqs[0], jnp.where(owner == 1, freqs[1], freqs[2]))
    emb = jnp.concatenate([picked, picked], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def rope_cos_sin(positions: jax.Array, cfg: ModelConfig) -> CosSin:
    """The global layers' tables (every layer's, for families with one rope)."""
    return cos_sin(positions, cfg.rotated_dims, cfg.rope_theta, cfg.rope_scaling)


def layer_rope(cfg: ModelConfig, layer: int) -> tuple[float, RopeScaling]:
    """(theta, scaling) of one layer: Gemma 3's sliding layers use their own base without scaling."""
    if cfg.local_rope_theta is not None and cfg.layer_windows[layer]:
        return cfg.local_rope_theta, RopeScaling()
    return cfg.rope_theta, cfg.rope_scaling


class RopeTables:
    """The tables of one forward, computed on first use per distinct (theta, scaling)."""

    def __init__(self, positions: jax.Array, cfg: ModelConfig, streams: jax.Array | None = None):
        """streams [3, B, T]: M-RoPE's position streams (Qwen2-VL with images); None: each equal to positions."""
        self._positions, self._cfg, self._streams = positions, cfg, streams
        self._tables: dict[tuple[int, float, RopeScaling], CosSin] = {}

    def for_layer(self, layer: int) -> CosSin | None:
        """cos, sin for `layer`'s queries and keys; None for a layer without rotary embeddings."""
        if layer in self._cfg.nope_layers:
            return None
        key = (self._cfg.layer_rotated_dims(layer), *layer_rope(self._cfg, layer))
        if key not in self._tables and self._cfg.mrope_section and self._streams is not None:
            self._tables[key] = mrope_cos_sin(self._streams, *key, self._cfg.mrope_section,
                                              self._cfg.mrope_interleaved)
        if key not in self._tables:
            self._tables[key] = cos_sin(self._positions, *key)
        return self._tables[key]


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, interleaved: bool = False) -> jax.Array:
    """Rotate the leading cos.shape[-1] dims of x [B, T, heads, head_dim]; the rest pass through (partial rotary).

    HF's rotate-half layout turns dim i with dim i + dims/2 by frequency i; the interleaved one (GLM's)
    turns dims 2i and 2i + 1, each frequency read once from the first half of the tables.
    """
    dims = cos.shape[-1]
    cos = cos[:, :, None, :].astype(x.dtype)
    sin = sin[:, :, None, :].astype(x.dtype)
    rot, rest = (x, None) if dims == x.shape[-1] else (x[..., :dims], x[..., dims:])
    half = dims // 2
    if interleaved:
        pairs = rot.reshape(*rot.shape[:-1], half, 2)
        even, odd, cos, sin = pairs[..., 0], pairs[..., 1], cos[..., :half], sin[..., :half]
        out = jnp.stack([even * cos - odd * sin, odd * cos + even * sin], axis=-1).reshape(rot.shape)
    else:
        rotated = jnp.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
        out = rot * cos + rotated * sin
    return out if rest is None else jnp.concatenate([out, rest], axis=-1)


def for_context(cfg: ModelConfig, max_seq_len: int) -> ModelConfig:
    """cfg for a model serving up to max_seq_len tokens: LongRoPE takes its long factors past the
    original context.

    transformers switches per call on the current length, so keys cached with the short factors
    would meet queries rotated with the long ones; deciding once per served context (as vLLM
    does) keeps a sequence's positions consistent and outputs independent of the batch.
    """
    scaling = cfg.rope_scaling
    if scaling.rope_type != "longrope":
        return cfg
    long = max_seq_len > scaling.original_max_position_embeddings
    return dataclasses.replace(cfg, rope_scaling=dataclasses.replace(scaling, long=long))
