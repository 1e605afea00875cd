"""DeepSeek-V4's HF config read as transformers' DeepseekV4Config reads it (its defaults, its legacy names:
`compress_ratios`, `compress_rate_csa` / `compress_rate_hca`, `num_hash_layers`, `qk_rope_head_dim`), with what
jaxinfer does not run refused by name.

Ropes: sliding-only layers turn by the "main" rope (rope_theta, unscaled), compressed layers and every compressed
entry by the "compress" one (compress_rope_theta, YaRN where the config scales it, cos and sin unscaled:
attention_factor 1). In the ModelConfig the compress rope is the model's (rope_theta, rope_scaling) and the main one
the sliding layers' own (`local_rope_theta`, chosen by their `layer_windows`), so `RopeTables` gives each layer its
own; the attention itself reads its window from `DeepseekV4Fields`.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.deepseek_v4 import CSA, HASH_MOE, HCA, LAYER_KINDS, MLP_KINDS, MOE, SLIDING, DeepseekV4Fields
from jaxinfer.config.hyper_connections import HyperConnections
from jaxinfer.config.model import ConfigError, ModelConfig, common_fields, field
from jaxinfer.config.rope_scaling import rope_fields
from jaxinfer.models.deepseek_v4_attention import row_layout
from jaxinfer.models.token_rows import half_width

# DeepseekV4Config's defaults for the fields a config may leave out (or null)
HF_DEFAULTS = dict(vocab_size=129280, hidden_size=4096, moe_intermediate_size=2048, num_hidden_layers=43,
                   num_attention_heads=64, head_dim=512, q_lora_rank=1024, num_experts_per_tok=6, n_routed_experts=256,
                   n_shared_experts=1, scoring_func="sqrtsoftplus", routed_scaling_factor=1.5,
                   max_position_embeddings=1048576, rope_theta=10000.0, compress_rope_theta=160000.0, hc_mult=4,
                   hc_sinkhorn_iters=20, hc_eps=1e-6, swiglu_limit=10.0, sliding_window=128, o_groups=8,
                   o_lora_rank=1024, index_n_heads=64, index_head_dim=128, index_topk=512, hidden_act="silu",
                   rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=1)
COMPRESS_RATES = {CSA: 4, HCA: 128}
RATIO_KINDS = {0: SLIDING, 4: CSA, 128: HCA}  # legacy compress_ratios entries
DEFAULT_HASH_LAYERS = 3


def _layer_kinds(hf: Mapping[str, Any], layers: int) -> tuple[str, ...]:
    """layer_types, else the legacy compress_ratios, else transformers' default (two HCA, then CSA / HCA in turn)."""
    kinds = field(hf, "layer_types", None)
    ratios = field(hf, "compress_ratios", None)
    if kinds is None and ratios is not None:
        if set(ratios) - set(RATIO_KINDS):
            raise ConfigError(f"compress_ratios {ratios!r} must hold only {sorted(RATIO_KINDS)}")
        kinds = [RATIO_KINDS[r] for r in ratios]
    if kinds is None:
        kinds = [HCA] * min(layers, 2) + [CSA if i % 2 else HCA for i in range(max(layers - 2, 0))]
    kinds = list(kinds)[:layers]
    if len(kinds) != layers or set(kinds) - set(LAYER_KINDS):
        raise ConfigError(f"layer_types {kinds!r} must give one of {list(LAYER_KINDS)} for each of the {layers} layers")
    return tuple(kinds)


def _hash_layers(hf: Mapping[str, Any], layers: int) -> tuple[int, ...]:
    """The hash-routed layers: mlp_layer_types "hash_moe", else the first num_hash_layers (default 3)."""
    kinds = field(hf, "mlp_layer_types", None)
    if kinds is None:
        hashed = int(field(hf, "num_hash_layers", DEFAULT_HASH_LAYERS))
        kinds = [HASH_MOE] * min(layers, hashed) + [MOE] * max(0, layers - hashed)
    kinds = list(kinds)[:layers]
    if len(kinds) != layers or set(kinds) - set(MLP_KINDS):
        raise ConfigError(f"mlp_layer_types {kinds!r} must give one of {list(MLP_KINDS)} for each of the {layers} "
                          "layers")
    return tuple(i for i, kind in enumerate(kinds) if kind == HASH_MOE)


def _compress_rates(hf: Mapping[str, Any]) -> dict[str, int]:
    """compress_rates by layer kind (the legacy compress_rate_csa / compress_rate_hca folded in)."""
    rates = {**COMPRESS_RATES, **(field(hf, "compress_rates", None) or {})}
    for kind, legacy in ((CSA, "compress_rate_csa"), (HCA, "compress_rate_hca")):
        if field(hf, legacy, None) is not None:
            rates[kind] = int(hf[legacy])
    if set(rates) != {CSA, HCA} or any(int(rate) < 1 for rate in rates.values()):
        raise ConfigError(f"compress_rates {rates!r} must give a rate >= 1 for exactly {CSA!r} and {HCA!r}")
    return {kind: int(rate) for kind, rate in rates.items()}


def _ropes(hf: Mapping[str, Any], head_dim: int) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """(rotated dims, main rope parameters, compress rope parameters), flat or nested as transformers keeps them."""
    factor = field(hf, "partial_rotary_factor", None)
    legacy = field(hf, "qk_rope_head_dim", None)
    dims = int(head_dim * float(factor)) if factor is not None else int(legacy) if legacy is not None else head_dim // 8
    params = dict(field(hf, "rope_parameters", None) or field(hf, "rope_scaling", None) or {})
    if isinstance(params.get("main"), dict) and isinstance(params.get("compress"), dict):
        return dims, dict(params["main"]), dict(params["compress"])
    scaling = {k: v for k, v in params.items() if k not in ("main", "compress", "rope_theta", "type")}
    scaling["rope_type"] = params.get("rope_type", params.get("type", "default"))  # transformers 4's "type" too
    main = dict(rope_type="default", rope_theta=hf["rope_theta"])
    return dims, main, {**scaling, "rope_theta": hf["compress_rope_theta"]}


def _checked(hf: Mapping[str, Any], arch: str) -> None:
    """Refuse what jaxinfer does not run as transformers would, by name."""
    if hf["scoring_func"] != "sqrtsoftplus":
        raise ConfigError(f"scoring_func {hf['scoring_func']!r} is not supported for {arch}; supported: "
                          "'sqrtsoftplus' (every released DeepSeek-V4)")
    if hf["hidden_act"] != "silu":
        raise ConfigError(f"hidden_act {hf['hidden_act']!r} is not supported for {arch}; supported: 'silu'")
    if hf.get("attention_bias"):
        raise ConfigError(f"attention_bias=True is not supported for {arch}: transformers builds no attention bias")
    if int(hf["n_shared_experts"]) != 1:
        raise ConfigError(f"n_shared_experts {hf['n_shared_experts']} is not supported for {arch}; supported: 1 "
                          "(transformers builds one shared expert of moe_intermediate_size)")
    heads, groups = int(hf["num_attention_heads"]), int(hf["o_groups"])
    if groups < 1 or heads % groups:
        raise ConfigError(f"o_groups {groups} must divide num_attention_heads {heads}")
    if int(hf["hc_mult"]) < 1 or int(hf["hc_sinkhorn_iters"]) < 1:
        raise ConfigError(f"hc_mult {hf['hc_mult']} and hc_sinkhorn_iters {hf['hc_sinkhorn_iters']} must be >= 1")
    if int(hf["index_topk"]) < 1 or int(hf["sliding_window"]) < 1:
        raise ConfigError(f"index_topk {hf['index_topk']} and sliding_window {hf['sliding_window']} must be >= 1")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a DeepSeek-V4 HF config (fields it leaves out or nulls take DeepseekV4Config's defaults)."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    _checked(hf, arch)
    layers, head = int(hf["num_hidden_layers"]), int(hf["head_dim"])
    dims, main, compress = _ropes(hf, head)
    index_dim = int(hf["index_head_dim"])
    if dims % 2 or not 0 < dims <= min(head, index_dim):
        raise ConfigError(f"partial_rotary_factor / qk_rope_head_dim gives {dims} rotated dims: they must be even, > 0 "
                          f"and at most head_dim {head} and index_head_dim {index_dim}")
    if main.get("rope_type", "default") != "default" or compress.get("rope_type", "default") not in ("default", "yarn"):
        raise ConfigError(f"rope_parameters {hf.get('rope_parameters')!r} not supported for {arch}: the main rope "
                          "'default', the compress rope 'default' or 'yarn'")
    theta, scaling = rope_fields(hf, {**compress, "attention_factor": 1.0} if compress.get("rope_type") == "yarn"
                                 else compress)
    kinds, rates = _layer_kinds(hf, layers), _compress_rates(hf)
    fields = DeepseekV4Fields(
        layer_kinds=kinds, hash_layers=_hash_layers(hf, layers), sliding_window=int(hf["sliding_window"]),
        csa_rate=rates[CSA], hca_rate=rates[HCA], q_lora_rank=int(hf["q_lora_rank"]), o_groups=int(hf["o_groups"]),
        o_lora_rank=int(hf["o_lora_rank"]), index_heads=int(hf["index_n_heads"]), index_dim=index_dim,
        index_topk=int(hf["index_topk"]))
    width = int(hf["moe_intermediate_size"])
    common = common_fields({**hf, "intermediate_size": width, "rope_parameters": None, "rope_scaling": None}, arch)
    hc = HyperConnections(mult=int(hf["hc_mult"]), eps=float(hf["hc_eps"]), norm_eps=float(hf["rms_norm_eps"]),
                          post_scale=2.0, post_eps=False, sinkhorn_iters=int(hf["hc_sinkhorn_iters"]))
    experts, k = int(hf["n_routed_experts"]), int(hf["num_experts_per_tok"])
    return ModelConfig(
        **{**common, "num_kv_heads": 1, "head_dim": head, "rope_theta": theta, "rope_scaling": scaling},
        layer_kv_heads=(1,) * layers,
        layer_head_dims=tuple(half_width(row_layout(fields, kind, head).width) for kind in kinds),
        local_rope_theta=float(main.get("rope_theta", hf["rope_theta"])),
        layer_windows=tuple(fields.sliding_window if kind == SLIDING else 0 for kind in kinds),
        rotary_dim=dims,
        rope_interleaved=True,
        swiglu_limit=float(hf["swiglu_limit"]),
        hyper_connections=hc,
        deepseek_v4=fields,
        num_experts=experts,
        experts_per_token=k,
        moe_intermediate_size=width,
        routed_scaling_factor=float(hf["routed_scaling_factor"]),
        norm_topk_prob=True,
    )
