"""Model configuration: one frozen, hashable dataclass read from an HF `config.json`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

from jaxinfer.generation_config import generation_defaults, merge_ids, token_ids

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "GemmaForCausalLM",
)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
SUPPORTED_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu_tanh"}


class ConfigError(ValueError):
    """A model configuration jaxinfer cannot run; the message says what is supported."""


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Rotary-embedding frequency scaling (HF `rope_parameters` / `rope_scaling`)."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of one Llama-family decoder; hashable so it can be a jit static arg."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    activation: str = "silu"
    norm_weight_offset: float = 0.0  # Gemma stores norm weights as (w - 1).
    scale_embeddings: bool = False  # Gemma multiplies embeddings by sqrt(hidden_size).
    # Per-layer sliding window in tokens; 0 means full attention.
    layer_windows: tuple[int, ...] = ()
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.layer_windows:
            object.__setattr__(self, "layer_windows", (0,) * self.num_layers)
        _validate(self)

    @property
    def q_per_kv(self) -> int:
        """Query heads sharing one KV head (GQA group size)."""
        return self.num_heads // self.num_kv_heads


def _validate(cfg: ModelConfig) -> None:
    if cfg.architecture not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(
            f"architecture {cfg.architecture!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    if cfg.num_heads % cfg.num_kv_heads:
        raise ConfigError(
            f"num_attention_heads ({cfg.num_heads}) must be a multiple of "
            f"num_key_value_heads ({cfg.num_kv_heads})"
        )
    if cfg.rope_scaling.rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(
            f"rope type {cfg.rope_scaling.rope_type!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if cfg.activation not in ("silu", "gelu_tanh"):
        raise ConfigError(f"activation {cfg.activation!r} is not supported; supported: silu, gelu_tanh")
    if len(cfg.layer_windows) != cfg.num_layers:
        raise ConfigError(f"layer_windows has {len(cfg.layer_windows)} entries for {cfg.num_layers} layers")


def _rope_scaling(hf: Mapping[str, Any]) -> tuple[float, RopeScaling]:
    """Read rope theta and scaling from either transformers 5 or 4 config layouts."""
    params = dict(hf.get("rope_parameters") or {})
    params.update(hf.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(
            f"rope type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    fields = {f.name for f in dataclasses.fields(RopeScaling)}
    kwargs = {k: v for k, v in params.items() if k in fields and k != "rope_type"}
    return theta, RopeScaling(rope_type=rope_type, **kwargs)


def _layer_windows(hf: Mapping[str, Any], arch: str, num_layers: int) -> tuple[int, ...]:
    """Sliding-window size per layer (0 = full attention)."""
    window = hf.get("sliding_window") or 0
    if arch == "MistralForCausalLM":
        return (int(window),) * num_layers
    if arch == "Qwen2ForCausalLM" and hf.get("use_sliding_window"):
        start = hf.get("max_window_layers", num_layers)
        return tuple(int(window) if i >= start else 0 for i in range(num_layers))
    return (0,) * num_layers


def from_hf_config(hf: Mapping[str, Any]) -> ModelConfig:
    """Build a ModelConfig from an HF config dict; unsupported features raise ConfigError."""
    archs = hf.get("architectures") or []
    if len(archs) != 1:
        raise ConfigError(
            f"config.json must name exactly one architecture (got {archs!r}); supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    arch = archs[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(
            f"architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    if hf.get("mlp_bias"):
        raise ConfigError("mlp_bias=True is not supported (no Llama-family checkpoint uses it)")
    default_act = "gelu_pytorch_tanh" if arch == "GemmaForCausalLM" else "silu"
    act_name = hf.get("hidden_activation") or hf.get("hidden_act") or default_act
    if act_name not in SUPPORTED_ACTIVATIONS:
        raise ConfigError(
            f"activation {act_name!r} is not supported; supported: {', '.join(SUPPORTED_ACTIVATIONS)}"
        )
    heads = int(hf["num_attention_heads"])
    hidden = int(hf["hidden_size"])
    num_layers = int(hf["num_hidden_layers"])
    theta, scaling = _rope_scaling(hf)
    is_gemma = arch == "GemmaForCausalLM"
    # Qwen2 always biases q/k/v (not o); Mistral never has biases; the rest follow attention_bias.
    attention_bias = bool(hf.get("attention_bias", False)) and arch != "MistralForCausalLM"
    return ModelConfig(
        architecture=arch,
        vocab_size=int(hf["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or hidden // heads),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", is_gemma)),
        qkv_bias=arch == "Qwen2ForCausalLM" or attention_bias,
        o_bias=attention_bias and arch != "Qwen2ForCausalLM",
        qk_norm=arch == "Qwen3ForCausalLM",
        activation=SUPPORTED_ACTIVATIONS[act_name],
        norm_weight_offset=1.0 if is_gemma else 0.0,
        scale_embeddings=is_gemma,
        layer_windows=_layer_windows(hf, arch, num_layers),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=token_ids(hf.get("eos_token_id")),
    )


def load_config(model_dir: str | Path) -> ModelConfig:
    """Read `config.json` from a model directory (HF or converted), with generation_config's EOS ids."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {model_dir}; pass an HF model directory or a converted one")
    cfg = from_hf_config(json.loads(path.read_text()))
    eos = merge_ids(cfg.eos_token_ids, generation_defaults(model_dir).eos_token_ids)
    return dataclasses.replace(cfg, eos_token_ids=eos)
