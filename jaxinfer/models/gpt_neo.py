"""EleutherAI's GPT-Neo (GPTNeoForCausalLM: gpt-neo-125M, 1.3B, 2.7B): GPT-2's model with local and global layers.

GPT-2's (`models.gpt2`: learned positions `wpe` gathered by position, the ungated sequential pre-norm layer
ln_1 / ln_2 with biases, the MLP c_proj(gelu_new(c_fc(x))) biased, the tied head `wte`) over torch Linear
weights, with q, k and v apart and unbiased (`attn.attention.q_proj` ...) and a biased `out_proj`. Two
differences: the scores are not scaled (GPT-Neo leaves out 1/sqrt(head_dim): `cfg.attn_scale` 1), and
`attention_types` ([[kinds, repeats], ...], expanded in turn: by default global and local alternating) makes
each "local" layer attend over the last `window_size` positions (itself included), a "global" one over all.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.generation import token_ids
from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.gpt2 import PREFIX, body_leaves
from jaxinfer.models.self_attention import attention_hf_leaves
from jaxinfer.models.ungated_mlp import abstract_layer, decoder_layer

ARCHITECTURES = ("GPTNeoForCausalLM",)
REQUIRED = ("vocab_size", "hidden_size", "num_layers", "num_heads")
# GPTNeoConfig's defaults for fields a config leaves out.
DEFAULTS = dict(activation_function="gelu_new", layer_norm_epsilon=1e-5, max_position_embeddings=2048,
                window_size=256, bos_token_id=50256, eos_token_id=50256, tie_word_embeddings=True,
                attention_types=[[["global", "local"], 12]])
KINDS = ("global", "local")


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """GPT-2's names over torch Linear weights, attention's under `attn.attention.` (the output `out_proj`)."""
    H, K, D = cfg.num_heads, cfg.head_dim, cfg.hidden_size
    attn = PREFIX + "h.{i}.attn.attention."
    leaves = body_leaves(cfg, conv1d=False)
    qkv = {name: leaf for name, leaf in attention_hf_leaves(cfg, attn).items() if name in ("wq", "wk", "wv")}
    return {**leaves, **qkv, "wo": HFLeaf(attn + "out_proj.weight", "out_heads", (D, H * K), H, K),
            "bo": HFLeaf(attn + "out_proj.bias", "same", (D,))}


def layer_kinds(hf: Mapping[str, Any], arch: str, num_layers: int) -> list[str]:
    """Each layer's "global" or "local", `attention_types` expanded as transformers expands it."""
    kinds = [kind for kinds, repeats in hf["attention_types"] for _ in range(int(repeats)) for kind in kinds]
    if len(kinds) != num_layers or not set(kinds) <= set(KINDS):
        raise ConfigError(f"attention_types {hf['attention_types']!r} expands to {kinds!r}; {arch} needs one of "
                          f"{KINDS} for each of its {num_layers} layers")
    return kinds


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a GPT-Neo HF config (hidden_size, num_layers, num_heads; intermediate_size 4 * hidden_size
    when null)."""
    hf = {**DEFAULTS, **hf}
    D, H, layers = int(hf["hidden_size"]), int(hf["num_heads"]), int(hf["num_layers"])
    if D % H:
        raise ConfigError(f"hidden_size ({D}) must be a multiple of num_heads ({H}) for {arch}")
    window = int(hf["window_size"])
    kinds = layer_kinds(hf, arch, layers)
    if window < 1 and "local" in kinds:
        raise ConfigError(f"window_size {window} must be >= 1 for {arch}'s local layers")
    return ModelConfig(
        architecture=arch, vocab_size=int(hf["vocab_size"]), hidden_size=D,
        intermediate_size=int(field(hf, "intermediate_size", 4 * D)), num_layers=layers, num_heads=H,
        num_kv_heads=H, head_dim=D // H, rms_norm_eps=float(hf["layer_norm_epsilon"]), layer_norm=True,
        norm_bias=True, o_bias=True, mlp_bias=True, max_position_embeddings=int(hf["max_position_embeddings"]),
        tie_word_embeddings=bool(hf["tie_word_embeddings"]), activation=activation_name(hf["activation_function"]),
        attn_scale=1.0, layer_windows=tuple(window if kind == "local" else 0 for kind in kinds),
        nope_layers=tuple(range(layers)), learned_positions=True, bos_token_id=hf["bos_token_id"],
        eos_token_ids=token_ids(hf["eos_token_id"]),
    )


FAMILY = Family("gpt_neo", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=(PREFIX + "wte.weight", PREFIX + "ln_f.weight"), positions_name=PREFIX + "wpe.weight",
                required=REQUIRED)
