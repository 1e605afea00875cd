"""Model configuration: one frozen, hashable dataclass read from an HF `config.json`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

from jaxinfer.config.errors import CheckpointError
from jaxinfer.config.generation import generation_defaults, merge_ids, token_ids

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "GemmaForCausalLM",
)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
# HF activation name -> ours. "gelu" is exact (erf) GELU, as transformers' ACT2FN has it, except
# for Gemma, whose configs use it as a legacy name for the tanh approximation (see _activation).
SUPPORTED_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
ACTIVATIONS = ("silu", "gelu", "gelu_tanh")
LAYER_TYPES = {"full_attention", "sliding_attention"}
QWEN_ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
# Read without a default: a config without them describes no model.
REQUIRED_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
HF_MAX_WINDOW_LAYERS = 28  # transformers' default for Qwen2/Qwen3


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
    if cfg.activation not in ACTIVATIONS:
        raise ConfigError(f"activation {cfg.activation!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
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


def _qwen_windows(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """Qwen2/Qwen3 as transformers reads them: `layer_types`, else sliding from `max_window_layers` on.

    Either way a sliding layer slides only when `use_sliding_window` is set (transformers drops
    `sliding_window` otherwise, and the layer attends to everything).
    """
    window = int(hf.get("sliding_window") or 0) if hf.get("use_sliding_window") else 0
    types = hf.get("layer_types")
    if types is None:
        start = int(hf.get("max_window_layers", HF_MAX_WINDOW_LAYERS))
        types = ["sliding_attention" if window and i >= start else "full_attention" for i in range(num_layers)]
    return tuple(window if t == "sliding_attention" else 0 for t in types)


def _layer_windows(hf: Mapping[str, Any], arch: str, num_layers: int) -> tuple[int, ...]:
    """Sliding-window size per layer (0 = full attention), checked against any `layer_types`."""
    types = hf.get("layer_types")
    if types is not None and (len(types) != num_layers or not set(types) <= LAYER_TYPES):
        raise ConfigError(
            f"layer_types {types!r} must list one of {sorted(LAYER_TYPES)} for each of the {num_layers} layers"
        )
    if arch in QWEN_ARCHITECTURES:
        return _qwen_windows(hf, num_layers)
    sliding = arch == "MistralForCausalLM" and bool(hf.get("sliding_window"))
    windows = (int(hf["sliding_window"]) if sliding else 0,) * num_layers
    if types is not None and types != ["sliding_attention" if sliding else "full_attention"] * num_layers:
        # transformers ignores layer_types for these architectures; running them either way would be a guess.
        raise ConfigError(
            f"layer_types {types!r} is not supported for {arch}: its layers all use "
            f"{'sliding_window' if sliding else 'full attention'}; per-layer types are read for "
            f"{', '.join(QWEN_ARCHITECTURES)}"
        )
    return windows


def _activation_name(name: str) -> str:
    if name not in SUPPORTED_ACTIVATIONS:
        raise ConfigError(f"activation {name!r} is not supported; supported: {', '.join(SUPPORTED_ACTIVATIONS)}")
    return SUPPORTED_ACTIVATIONS[name]


def _activation(hf: Mapping[str, Any], arch: str) -> str:
    """Our activation name. For Gemma "gelu" means tanh, as transformers has it (a legacy name).

    transformers 4 reads Gemma's `hidden_activation` and 5 its `hidden_act`; when a config
    sets both to different functions the two versions disagree, so it is rejected.
    """
    if arch != "GemmaForCausalLM":
        return _activation_name(hf.get("hidden_act") or "silu")
    names = [hf[k] for k in ("hidden_activation", "hidden_act") if hf.get(k)] or ["gelu_pytorch_tanh"]
    chosen = {_activation_name("gelu_pytorch_tanh" if n == "gelu" else n) for n in names}
    if len(chosen) > 1:
        raise ConfigError(
            f"Gemma hidden_activation {hf['hidden_activation']!r} and hidden_act {hf['hidden_act']!r} name "
            "different functions (transformers 4 reads the first, 5 the second); make them agree"
        )
    return chosen.pop()


def from_hf_config(hf: Mapping[str, Any]) -> ModelConfig:
    """Build a ModelConfig from an HF config dict; unsupported features raise ConfigError."""
    archs = hf.get("architectures") or []
    if len(archs) != 1:
        raise ConfigError(
            f"architectures must name exactly one architecture (got {archs!r}); supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    arch = archs[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(
            f"architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    missing = [key for key in REQUIRED_FIELDS if hf.get(key) is None]
    if missing:
        raise ConfigError(f"no {', '.join(missing)}; an HF config of a Llama-family model sets "
                          f"{', '.join(REQUIRED_FIELDS)}")
    if hf.get("mlp_bias"):
        raise ConfigError("mlp_bias=True is not supported (no Llama-family checkpoint uses it)")
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
        activation=_activation(hf, arch),
        norm_weight_offset=1.0 if is_gemma else 0.0,
        scale_embeddings=is_gemma,
        layer_windows=_layer_windows(hf, arch, num_layers),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=token_ids(hf.get("eos_token_id")),
    )


def read_config_json(model_dir: str | Path) -> dict[str, Any]:
    """The parsed `config.json` of a model directory; an error naming the file unless it holds a JSON object."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"no config.json in {model_dir}; pass an HF model directory or a converted one")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path} is not valid JSON ({err}); expected the model's HF config.json") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} holds a JSON {type(raw).__name__}; expected an object (the model's HF config.json)")
    return raw


def load_config(model_dir: str | Path) -> ModelConfig:
    """Read `config.json` from a model directory (HF or converted), with generation_config's EOS ids."""
    hf = read_config_json(model_dir)
    try:
        cfg = from_hf_config(hf)
    except ConfigError as err:  # the dict-level message, with the file it came from
        raise ConfigError(f"{Path(model_dir) / 'config.json'}: {err}") from None
    eos = merge_ids(cfg.eos_token_ids, generation_defaults(model_dir).eos_token_ids)
    return dataclasses.replace(cfg, eos_token_ids=eos)
