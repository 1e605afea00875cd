"""MiMo-V2-Flash's HF config as transformers reads it, and as the released checkpoint spells it.

transformers' MiMoV2FlashConfig reads `layer_types`, `mlp_layer_types`, per-layer-type `rope_parameters` and
`sliding_window_size` (+ 1: the query counts). The released config.json is written for the remote code vLLM and
SGLang run: `hybrid_layer_pattern` (1 = sliding) and `moe_layer_freq` (1 = routed) list the layers, the sliding
layers' shapes are `swa_num_key_value_heads` / `swa_head_dim` / `swa_v_head_dim`, their theta `swa_rope_theta`,
`partial_rotary_factor` sits at the top level, `add_{swa,full}_attention_sink_bias` say which kind has sinks,
`layernorm_epsilon` is the norms' epsilon and a null `attention_value_scale` means 1 (the modeling code's
fallback). Both spellings are read here, transformers' first; what neither runs is refused by name.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.layer_type_rope import layer_type_rope
from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields
from jaxinfer.models.glm import rotary_dim
from jaxinfer.models.grouped_topk import check_groups
from jaxinfer.models.mixtral import moe_fields

ARCHITECTURES = ("MiMoV2FlashForCausalLM",)
# MiMoV2FlashConfig's defaults for the fields a config leaves out (or nulls) that differ from ours.
HF_DEFAULTS = dict(vocab_size=152576, hidden_size=4096, intermediate_size=16384, num_hidden_layers=48,
                   num_attention_heads=64, num_key_value_heads=4, head_dim=192, v_head_dim=128,
                   max_position_embeddings=131072, moe_intermediate_size=2048, num_experts_per_tok=8,
                   n_routed_experts=256, routed_scaling_factor=1.0, n_group=1, topk_group=1, norm_topk_prob=True,
                   sliding_window=129, attention_value_scale=0.707, attention_bias=False, bos_token_id=1)
THETAS = {"full_attention": 5_000_000.0, "sliding_attention": 10_000.0}
PARTIAL_ROTARY_FACTOR = 0.334
# The remote code's flags for which layer kind has sinks, and the one value each has in what is run.
SINK_FLAGS = {"add_swa_attention_sink_bias": True, "add_full_attention_sink_bias": False}


def _kinds(hf: Mapping[str, Any], key: str, pattern_key: str, names: tuple[str, str], default: list[str],
           num_layers: int) -> list[str]:
    """One of two kinds per layer: transformers' list (`key`), else the remote code's 0/1 list (`pattern_key`,
    1 naming the second kind), else transformers' default."""
    if hf.get(key) is not None:
        kinds = list(hf[key])
    elif hf.get(pattern_key) is not None:
        pattern = list(hf[pattern_key])
        if not set(pattern) <= {0, 1}:
            raise ConfigError(f"{pattern_key} {pattern!r} must list 0 or 1 for each of the {num_layers} layers")
        kinds = [names[p] for p in pattern]
    else:
        kinds = default
    if len(kinds) != num_layers or not set(kinds) <= set(names):
        raise ConfigError(f"{key} {kinds!r} must list one of {sorted(names)} for each of the {num_layers} layers")
    return kinds


def layer_kinds(hf: Mapping[str, Any], num_layers: int) -> tuple[list[str], list[str]]:
    """(attention kind, MLP kind) per layer; by default the first and every 6th layer full, the first dense."""
    attention = _kinds(hf, "layer_types", "hybrid_layer_pattern", ("full_attention", "sliding_attention"),
                       ["full_attention" if i == 0 or (i + 1) % 6 == 0 else "sliding_attention"
                        for i in range(num_layers)], num_layers)
    mlp = _kinds(hf, "mlp_layer_types", "moe_layer_freq", ("dense", "sparse"),
                 ["dense"] + ["sparse"] * (num_layers - 1), num_layers)
    return attention, mlp


def rotary_dims(hf: Mapping[str, Any], head_dim: int) -> int:
    """The rotated dims: one partial_rotary_factor for both layer kinds (per type, else the top level's, else
    0.334)."""
    params = hf.get("rope_parameters") or {}
    top = float(hf.get("partial_rotary_factor") or PARTIAL_ROTARY_FACTOR)
    factors = {float((params.get(kind) or {}).get("partial_rotary_factor", top)) for kind in THETAS}
    if len(factors) > 1:
        raise ConfigError(f"rope_parameters' partial_rotary_factor {sorted(factors)} is not supported: one factor "
                          "for the full and the sliding layers")
    return rotary_dim({"partial_rotary_factor": factors.pop()}, head_dim)


def sliding_kv_heads(hf: Mapping[str, Any], arch: str) -> int:
    """The sliding layers' kv heads (`swa_num_key_value_heads`, else twice the full layers', as transformers
    builds them), refusing sliding-layer query heads and head dims unlike the full layers'."""
    for swa, full in (("swa_num_attention_heads", "num_attention_heads"), ("swa_head_dim", "head_dim"),
                      ("swa_v_head_dim", "v_head_dim")):
        if hf.get(swa) is not None and int(hf[swa]) != int(hf[full]):
            raise ConfigError(f"{swa} {hf[swa]} is not supported for {arch}: the full layers' {full} ({hf[full]}), "
                              "as transformers builds the sliding layers")
    for flag, value in SINK_FLAGS.items():
        if bool(hf.get(flag, value)) != value:
            raise ConfigError(f"{flag}={hf[flag]} is not supported for {arch}: sinks on the sliding layers only "
                              "(as transformers runs MiMo-V2-Flash and the released checkpoint sets)")
    return int(hf.get("swa_num_key_value_heads") or 2 * int(hf["num_key_value_heads"]))


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a MiMo-V2-Flash HF config (fields it leaves out or nulls take MiMoV2FlashConfig's defaults,
    but a null attention_value_scale: 1)."""
    value_scale = hf.get("attention_value_scale", HF_DEFAULTS["attention_value_scale"])
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    hf.setdefault("rms_norm_eps", float(hf.get("layernorm_epsilon", 1e-5)))
    if hf["attention_bias"]:
        raise ConfigError(f"attention_bias=True is not supported for {arch} (no released checkpoint has biases)")
    theta, scaling, local_theta = layer_type_rope(hf, THETAS, "swa_rope_theta", arch)
    fields = {**common_fields({**hf, "rope_parameters": None}, arch), "rope_theta": theta, "rope_scaling": scaling}
    layers, kv_heads = fields["num_layers"], fields["num_kv_heads"]
    kinds, mlps = layer_kinds(hf, layers)
    # transformers' note: `sliding_window_size` keys before the query, so the window (query included) is one more
    window = int(hf["sliding_window_size"]) + 1 if hf.get("sliding_window_size") is not None \
        else int(hf["sliding_window"])
    moe = moe_fields(hf, "n_routed_experts", int(hf["moe_intermediate_size"]), experts=256, per_token=8)
    groups, groups_per_token = int(hf["n_group"]), int(hf["topk_group"])
    check_groups(moe["num_experts"], groups, groups_per_token, moe["experts_per_token"])
    sliding = [kind == "sliding_attention" for kind in kinds]
    swa_heads = sliding_kv_heads(hf, arch)
    return ModelConfig(
        **fields,
        layer_kv_heads=tuple(swa_heads if s else kv_heads for s in sliding),
        v_head_dim=int(hf["v_head_dim"]),
        value_scale=1.0 if value_scale is None else float(value_scale),
        rotary_dim=rotary_dims(hf, fields["head_dim"]),
        local_rope_theta=local_theta,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=tuple(window if s else 0 for s in sliding),
        dense_layers=tuple(i for i, kind in enumerate(mlps) if kind == "dense"),
        norm_topk_prob=bool(hf["norm_topk_prob"]),
        expert_groups=groups,
        expert_groups_per_token=groups_per_token,
        routed_scaling_factor=float(hf["routed_scaling_factor"]),
        **moe,
    )
