"""MosaicML's MPT (MptForCausalLM: mpt-7b, mpt-30b and their instruct/chat models): ALiBi attention in a bias-free
ungated layer.

`models.ungated_mlp`'s sequential layer: norm_1, attention, norm_2, ffn.down_proj(gelu(ffn.up_proj(x))) at
`expansion_ratio` times the width; LayerNorms without a bias and no projection biases (`no_bias`, what
transformers' MPT builds). No position embedding: each head's scores take ALiBi's bias with MPT's slopes
(`alibi.mpt_slopes`, `attn_config.alibi_bias_max`; transformers' MPT always uses 8, every release's value).
`Wqkv` holds every head's q rows, then k, then v (read as three at load), clamped to `clip_qkv` after the
projection; `softmax_scale` replaces 1/sqrt(head_dim). The head is tied to `wte`. Refused by name: `alibi=False`
(learned positions), `qk_ln` (q/k LayerNorms) and `prefix_lm` (neither of which transformers' MPT builds, so no
reference checks them), `no_bias=False`, a `logit_scale`.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.generation import token_ids
from jaxinfer.config.model import ConfigError, ModelConfig, field
from jaxinfer.models.alibi import mpt_slopes
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.ungated_mlp import abstract_layer, decoder_layer

ARCHITECTURES = ("MptForCausalLM",)
REQUIRED = ("vocab_size", "d_model", "n_layers", "n_heads")
PREFIX = "transformer."
# MptConfig's and MptAttentionConfig's defaults for fields a config leaves out.
DEFAULTS = dict(expansion_ratio=4, max_seq_len=2048, layer_norm_epsilon=1e-5, no_bias=True, logit_scale=None,
                tie_word_embeddings=True)
ATTN_DEFAULTS = dict(alibi=True, alibi_bias_max=8, clip_qkv=None, softmax_scale=None, qk_ln=False, prefix_lm=False)
# attn_config settings refused, with the value run and what the other one would need.
REFUSED = {
    "alibi": (True, "learned position embeddings; supported: true (ALiBi, every release)"),
    # transformers' MptForCausalLM builds neither (it runs such a checkpoint without its q_ln / k_ln, and causally):
    # only MosaicML's remote code does, so no reference here checks either; supported: false
    "qk_ln": (False, "LayerNorms on q and k, which transformers' MPT does not build; supported: false"),
    "prefix_lm": (False, "a bidirectional prefix needing a prefix mask per request, which transformers' MPT does not "
                  "build; supported: false"),
}


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives: q/k/v as row blocks of the fused `Wqkv` (all heads' q, then k, then v)."""
    H, K, D, F = cfg.num_heads, cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
    layer = PREFIX + "blocks.{i}."
    qkv = (layer + "attn.Wqkv.weight", "in_heads", (3 * H * K, D))
    return {
        **{f"w{p}": HFLeaf(*qkv, heads=H, head_dim=K, row_offset=i * H * K) for i, p in enumerate("qkv")},
        "wo": HFLeaf(layer + "attn.out_proj.weight", "out_heads", (D, H * K), H, K),
        "w_up": HFLeaf(layer + "ffn.up_proj.weight", "transpose", (F, D)),
        "w_down": HFLeaf(layer + "ffn.down_proj.weight", "transpose", (D, F)),
        "attn_norm": HFLeaf(layer + "norm_1.weight", "same", (D,)),
        "mlp_norm": HFLeaf(layer + "norm_2.weight", "same", (D,)),
    }


def _refuse(hf: Mapping[str, Any], attn: Mapping[str, Any], arch: str) -> None:
    """ConfigError naming the first setting not run."""
    for name, (runs, why) in REFUSED.items():
        if bool(attn[name]) != runs:
            raise ConfigError(f"attn_config.{name}={attn[name]} is not supported for {arch} ({why})")
    if not hf["no_bias"]:
        raise ConfigError(f"no_bias=False is not supported for {arch} (transformers' MPT has no biases); "
                          "supported: true")
    if hf["logit_scale"] is not None:
        raise ConfigError(f"logit_scale={hf['logit_scale']!r} is not supported for {arch}; supported: null")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of an MPT HF config (d_model, n_layers, n_heads; attention settings under attn_config)."""
    hf = {**DEFAULTS, **hf}
    attn = {**ATTN_DEFAULTS, **(hf.get("attn_config") or {})}
    _refuse(hf, attn, arch)
    D, H, layers = int(hf["d_model"]), int(hf["n_heads"]), int(hf["n_layers"])
    if D % H:
        raise ConfigError(f"d_model ({D}) must be a multiple of n_heads ({H})")
    scale = field(attn, "softmax_scale", None)
    return ModelConfig(
        architecture=arch, vocab_size=int(hf["vocab_size"]), hidden_size=D,
        intermediate_size=int(hf["expansion_ratio"] * D), num_layers=layers, num_heads=H, num_kv_heads=H,
        head_dim=D // H, rms_norm_eps=float(hf["layer_norm_epsilon"]), layer_norm=True,
        clip_qkv=None if attn["clip_qkv"] is None else float(attn["clip_qkv"]),
        max_position_embeddings=int(hf["max_seq_len"]), tie_word_embeddings=bool(hf["tie_word_embeddings"]),
        activation="gelu", attn_scale=None if scale is None else float(scale), nope_layers=tuple(range(layers)),
        alibi_slopes=mpt_slopes(H, float(attn["alibi_bias_max"])), bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=token_ids(hf.get("eos_token_id")),
    )


FAMILY = Family("mpt", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=(PREFIX + "wte.weight", PREFIX + "norm_f.weight"), required=REQUIRED)
