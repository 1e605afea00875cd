"""What a model with state layers (Mamba2, Gated DeltaNet, short convs) runs without, refused by name (see
cache/state_pool).

Prefix caching: a cached page holds K/V, not the recurrent state after it, so a request cannot start
from another's pages (vLLM served these models without it at first too); it is off by default for
them and `enable_prefix_caching=True` is refused. Speculative decoding: a rejected draft would have to
roll the state back, which the per-slot state cannot. KV offloading keeps evicted prefix-cache pages,
so it is refused with prefix caching.
"""

from __future__ import annotations

from jaxinfer.config.model import ConfigError, ModelConfig
from jaxinfer.speculative.config import SpeculativeConfig

# how the messages name them
STATE_LAYERS = "state layers (Mamba-1, Mamba2, Gated DeltaNet, lightning attention or short conv)"


def check_row_pages(kv_dtype: str, cfg: ModelConfig) -> None:
    """Refuse quantized pages where a model keeps per-token rows in them that it reads back as values (Qwen4-Exp's
    token ids, conv inputs and index keys; DeepSeek-V4's compressor inputs and entries; MiniMax-M3's sparse layers'
    keys, values and index keys: models/token_rows)."""
    if cfg.qwen4_exp is not None and kv_dtype != "auto":
        raise ConfigError(f"kv_cache_dtype {kv_dtype!r} is not supported for {cfg.architecture}: its PLE and QSA "
                          "layers keep token ids, conv inputs and index keys in their pages (not quantized yet); use "
                          "'auto'")
    if cfg.deepseek_v4 is not None and kv_dtype != "auto":
        raise ConfigError(f"kv_cache_dtype {kv_dtype!r} is not supported for {cfg.architecture}: its layers keep "
                          "their compressors' raw inputs and compressed entries in their pages (not quantized yet); "
                          "use 'auto'")
    if cfg.block_indexer is not None and cfg.block_indexer.layers and kv_dtype != "auto":
        raise ConfigError(f"kv_cache_dtype {kv_dtype!r} is not supported for {cfg.architecture}: its sparse layers "
                          "keep each token's keys, values and index key as one row in their pages (not quantized "
                          "yet); use 'auto'")


def prefix_caching_setting(asked: bool | None, cfg: ModelConfig) -> bool:
    """enable_prefix_caching as it runs: None is on, unless the model has state layers or cross-attends
    (then off)."""
    if cfg.encoder_frames:  # Whisper: a page's K/V follow the request's audio, which page hashes do not see
        if asked:
            raise ConfigError(f"enable_prefix_caching=True is not supported for {cfg.architecture}: its pages' K/V "
                              "depend on each request's audio; leave it unset or False")
        return False
    if cfg.state_space is None:
        return True if asked is None else bool(asked)
    if asked:
        raise ConfigError(f"enable_prefix_caching=True is not supported for {cfg.architecture}: its {STATE_LAYERS} "
                          "keep a recurrent state per request, which cached pages do not hold; leave it unset or False")
    return False


def check_speculation(speculative: SpeculativeConfig | None, cfg: ModelConfig) -> None:
    """Refuse speculative decoding for a model with state layers (a rejected draft cannot be rolled back) or
    cross-attention (drafters read no audio)."""
    if speculative is not None and cfg.encoder_frames:
        raise ConfigError(f"speculative decoding (method {speculative.method!r}) is not supported for "
                          f"{cfg.architecture}: its drafters would not see the audio; leave speculative unset")
    if speculative is not None and cfg.state_space is not None:
        raise ConfigError(f"speculative decoding (method {speculative.method!r}) is not supported for "
                          f"{cfg.architecture}: the recurrent state of its {STATE_LAYERS} cannot be rolled back "
                          "past a rejected draft; leave speculative unset")


def check_offloading(size: float | None, cfg: ModelConfig) -> float | None:
    """kv_offloading_size as given; refused for a model with state layers (it has no prefix cache to offload)."""
    if size and cfg.state_space is not None:
        raise ConfigError(f"kv_offloading_size={size!r} is not supported for {cfg.architecture}: it keeps evicted "
                          f"prefix-cache pages, and its {STATE_LAYERS} run without prefix caching; leave it unset")
    return size
