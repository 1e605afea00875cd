"""Mistral Large 4 (MistralLarge4ForConditionalGeneration), its language model: DeepSeek-V3.2's shape with
Mistral's own attention pieces and Mistral Small 4's router.

Each layer is DeepSeek-V3.2's (`models.deepseek_v32`: latent attention reading the `index_topk` tokens a lightning
indexer picks, cached as [c, k_pe, index key]) with the attention of `models.mistral_large4_attention` (learned
rotary frequencies, learned per-head query scales, no low-rank query, NoPE layers), then a dense MLP or routed
experts beside ungated shared ones as `mlp_layer_types` says. The router is Mistral Small 4's
(`models.mistral4.route`: softmax scores, groups ranked by their two best, always renormalised, times
routed_scaling_factor), in float32 as transformers keeps it. The logits pass through final_logit_softcapping
(cap * tanh(logits / cap)).

The checkpoint is Mistral's own layout (`tok_embeddings`, `layers.{i}.attention.wq`, `experts.{e}.w1`,
`lerope.alpha`, `output`, ...: `hf_leaves`), which transformers renames on load and writes back on save; the
Pixtral vision tower and its projector beside it (`models.text_part`) are not read: it runs text only; its MTP
head (`mtp_dspark.*`, which transformers does not build either) is not read.

Refused by name: layers reading another layer's latent cache (`kv_source_layers`), layers reusing the last full
layer's top-k (`indexer_types` "shared", from `index_topk_freq` / `index_topk_pattern`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

import jax

from jaxinfer.config.latent_attention import LightningIndexer
from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields
from jaxinfer.models.deepseek import DeepseekMoELayerWeights, decoder_layer, grouped_fields, latent_fields
from jaxinfer.models.deepseek import abstract_layer as deepseek_layer
from jaxinfer.models.deepseek_v32 import DsaLayerWeights, DsaMoELayerWeights
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.lightning_indexer import indexer_hf_leaves, indexer_leaves
from jaxinfer.models.ministral3 import rope_parameters
from jaxinfer.models.mistral4 import route
from jaxinfer.models.mistral_large4_attention import Large4Scales, large4_attention, scale_leaves
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.moe import experts_hf_leaves
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("MistralLarge4ForConditionalGeneration",)
# MistralLarge4TextConfig's defaults for the fields a config may leave out (or null).
HF_DEFAULTS = dict(moe_intermediate_size=6144, n_shared_experts=1, n_routed_experts=128, routed_scaling_factor=1.0,
                   kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=64, n_group=1,
                   topk_group=1, num_experts_per_tok=4, first_k_dense_replace=1, max_position_embeddings=1048576,
                   rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, index_topk=2048, index_head_dim=128,
                   index_n_heads=32, final_logit_softcapping=30.0)
DEFAULT_ROPE = dict(rope_type="yarn", rope_theta=10000.0, factor=2048.0, original_max_position_embeddings=512,
                    beta_fast=32.0, beta_slow=1.0, attention_factor=1.0)
NO_ROPE_INTERVAL = 4  # MistralLarge4TextConfig's no_rope_layer_interval: every 4th layer NoPE by default
ATTENTION, INDEXER = "layers.{i}.attention.", "layers.{i}.attention.indexer."


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class Large4LayerWeights(DsaLayerWeights, Large4Scales):
    """A dense layer."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class Large4MoELayerWeights(DsaMoELayerWeights, Large4Scales):
    """An MoE layer."""


def _nope(cfg: ModelConfig, layer: int) -> bool:
    return layer in cfg.nope_layers


def abstract_layer(cfg: ModelConfig, layer: int) -> Any:
    """DeepSeek's layer leaves (no correction bias) with the indexer's (its wq_b reading the hidden size) and the
    scales; a NoPE layer's kv_a without rope columns and its w_uk over every query dim."""
    base = deepseek_layer(cfg, layer, correction=False)
    kind = Large4MoELayerWeights if isinstance(base, DeepseekMoELayerWeights) else Large4LayerWeights
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    index = indexer_leaves(cfg)
    index["index_wq"] = ArrayInfo((cfg.hidden_size, *index["index_wq"].shape[1:]), index["index_wq"].axes)
    if _nope(cfg, layer):
        mla, D, H = cfg.latent_attention, cfg.hidden_size, cfg.num_heads
        fields["wkv_a"] = ArrayInfo((D, mla.kv_lora_rank), fields["wkv_a"].axes)
        fields["w_uk"] = ArrayInfo((H, mla.kv_lora_rank, mla.qk_head_dim), fields["w_uk"].axes)
    return kind(**fields, **index, **scale_leaves(cfg))


def _mlp_leaves(prefix: str, hidden: int, intermediate: int) -> dict[str, HFLeaf]:
    """A gated MLP as Mistral stores it: w1 (gate), w3 (up), w2 (down)."""
    return {"w_gate": HFLeaf(prefix + "w1.weight", "transpose", (intermediate, hidden)),
            "w_up": HFLeaf(prefix + "w3.weight", "transpose", (intermediate, hidden)),
            "w_down": HFLeaf(prefix + "w2.weight", "transpose", (hidden, intermediate))}


def _attention_leaves(cfg: ModelConfig, key_dims: int, rope_dims: int) -> dict[str, HFLeaf]:
    """The latent attention's tensors (a rope layer's: key_dims N and rope_dims P; a NoPE layer's: N + P and 0)."""
    mla, D, H = cfg.latent_attention, cfg.hidden_size, cfg.num_heads
    R, V, K = mla.kv_lora_rank, mla.v_head_dim, mla.qk_head_dim
    kv_b = (H * (key_dims + V), R)
    return {
        "wq": HFLeaf(ATTENTION + "wq.weight", "in_heads", (H * K, D), H, K),
        "wkv_a": HFLeaf(ATTENTION + "wkv_a_with_mqa.weight", "transpose", (R + rope_dims, D)),
        "kv_a_norm": HFLeaf(ATTENTION + "kv_a_norm.weight", "same", (R,)),
        "w_uk": HFLeaf(ATTENTION + "wkv_b.weight", "head_rows_transposed", kv_b, H, key_dims),
        "w_uv": HFLeaf(ATTENTION + "wkv_b.weight", "head_rows", kv_b, H, V, row_offset=key_dims),
        "wo": HFLeaf(ATTENTION + "wo.weight", "out_heads", (D, H * V), H, V),
    }


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives, under the names Mistral's checkpoints (and transformers, saving one) use:
    `layers.{i}.attention.*` (wq, wkv_a_with_mqa, kv_a_norm, wkv_b, wo, ssmax_scaling, indexer.*), `feed_forward`,
    `gate`, `experts.{e}`, `shared_experts` (w1 gate, w3 up, w2 down), and the model's `lerope.alpha`."""
    D, H, E, mla = cfg.hidden_size, cfg.num_heads, cfg.num_experts, cfg.latent_attention
    J, I = mla.indexer.index_n_heads, mla.indexer.index_head_dim
    shared = _mlp_leaves("layers.{i}.shared_experts.", D, cfg.shared_expert_intermediate_size)
    return {
        "attn_norm": HFLeaf("layers.{i}.attention_norm.weight", "same", (D,)),
        "mlp_norm": HFLeaf("layers.{i}.ffn_norm.weight", "same", (D,)),
        **_attention_leaves(cfg, mla.qk_nope_head_dim, mla.qk_rope_head_dim),
        "query_scale": HFLeaf(ATTENTION + "ssmax_scaling.s", "same", (H,)),
        "query_bias": HFLeaf(ATTENTION + "ssmax_scaling.b", "same", (H,)),
        **indexer_hf_leaves(cfg, INDEXER),
        "index_wq": HFLeaf(INDEXER + "wq_b.weight", "in_heads", (J * I, D), J, I),
        "index_q_norm": HFLeaf(INDEXER + "q_input_norm.weight", "same", (D,)),
        "index_q_norm_bias": HFLeaf(INDEXER + "q_input_norm.bias", "same", (D,)),
        "index_query_scale": HFLeaf(INDEXER + "ssmax_scaling.s", "same", (J,)),
        "index_query_bias": HFLeaf(INDEXER + "ssmax_scaling.b", "same", (J,)),
        "rope_alpha": HFLeaf("lerope.alpha", "same", (mla.qk_rope_head_dim // 2,)),
        **_mlp_leaves("layers.{i}.feed_forward.", D, cfg.intermediate_size),
        "router": HFLeaf("layers.{i}.gate.weight", "transpose", (E, D)),
        **experts_hf_leaves(cfg, "layers.{i}.experts.", ("w1", "w3", "w2")),
        "shared_gate": shared["w_gate"], "shared_up": shared["w_up"], "shared_down": shared["w_down"],
    }


def layer_hf_leaves(cfg: ModelConfig, layer: int) -> dict[str, HFLeaf]:
    """A NoPE layer's attention tensors: wkv_a_with_mqa gives the latent alone, wkv_b each head's N + P key rows."""
    mla = cfg.latent_attention
    return _attention_leaves(cfg, mla.qk_head_dim, 0) if _nope(cfg, layer) else {}


def _per_layer(hf: Mapping[str, Any], name: str, default: list[Any], accepted: tuple[Any, ...], arch: str) -> list:
    """The per-layer list `name` (default where absent), checked: one entry per layer, each in `accepted`."""
    values = hf.get(name)
    values = list(default if values is None else values)
    if len(values) != len(default) or set(values) - set(accepted):
        raise ConfigError(f"{name} {values!r} is not supported for {arch}: one entry per layer "
                          f"({len(default)}), each one of {accepted!r}")
    return values


def _layer_kinds(hf: Mapping[str, Any], arch: str, layers: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The dense layers and the NoPE layers; layouts not implemented refused by name."""
    sources = hf.get("kv_source_layers")
    if sources is not None and list(sources) != list(range(layers)):
        raise ConfigError(f"kv_source_layers {sources!r} is not supported for {arch}: every layer caches its own "
                          f"latent ({list(range(layers))}); layers reading another's cache are not implemented")
    _per_layer(hf, "layer_types", ["indexed_attention"] * layers, ("indexed_attention",), arch)
    indexers = _per_layer(hf, "indexer_types", ["full"] * layers, ("full",), arch)
    pattern, freq = hf.get("index_topk_pattern"), int(hf.get("index_topk_freq") or 1)
    if freq > 1 or (pattern is not None and set(pattern) - {"F", "full"}) or len(indexers) != layers:
        raise ConfigError(f"index_topk_freq {freq} / index_topk_pattern {pattern!r} is not supported for {arch}: "
                          "every layer runs its own indexer (layers reusing a full layer's top-k are not implemented)")
    dense = min(int(hf["first_k_dense_replace"]), layers)
    mlp = _per_layer(hf, "mlp_layer_types", ["dense"] * dense + ["sparse"] * (layers - dense), ("dense", "sparse"),
                     arch)
    interval = int(hf.get("no_rope_layer_interval") or NO_ROPE_INTERVAL)
    rope = _per_layer(hf, "no_rope_layers", [int((i + 1) % interval != 0) for i in range(layers)], (0, 1), arch)
    return (tuple(i for i, kind in enumerate(mlp) if kind == "dense"),
            tuple(i for i, turned in enumerate(rope) if not turned))


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Mistral Large 4 text config (fields it leaves out or nulls take MistralLarge4TextConfig's
    defaults): MLA without a low-rank query, one row [c, k_pe, index key] cached per token."""
    hf = {**HF_DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    layers = int(hf["num_hidden_layers"])
    dense, nope = _layer_kinds(hf, arch, layers)
    params = rope_parameters(hf, DEFAULT_ROPE)
    kept = {k: v for k, v in hf.items() if k not in ("layer_types", "mlp_layer_types", "indexer_types")}
    fields = common_fields({**kept, "rope_parameters": params, "rope_scaling": None}, arch)
    moe = moe_fields(hf, "n_routed_experts", int(hf["moe_intermediate_size"]))
    latent = latent_fields({**hf, "q_lora_rank": None}, fields, True)
    indexer = LightningIndexer(index_topk=int(hf["index_topk"]), index_head_dim=int(hf["index_head_dim"]),
                               index_n_heads=int(hf["index_n_heads"]), rope_interleaved=True)
    if indexer.index_head_dim < latent["rotary_dim"] or indexer.index_topk < 1:
        raise ConfigError(f"index_head_dim {indexer.index_head_dim} / index_topk {indexer.index_topk} not supported "
                          f"for {arch}: index_head_dim >= qk_rope_head_dim ({latent['rotary_dim']}), index_topk >= 1")
    mla = dataclasses.replace(latent.pop("latent_attention"), indexer=indexer)
    cap = hf["final_logit_softcapping"]
    return ModelConfig(
        **{**latent, "head_dim": mla.cached_dims},
        latent_attention=mla,
        activation=activation_name(hf.get("hidden_act") or "silu"),
        layer_windows=(0,) * layers,
        dense_layers=dense,
        nope_layers=nope,
        final_soft_cap=float(cap) if cap else None,
        **grouped_fields({**hf, "norm_topk_prob": True}, arch, moe),
        **moe,
    )


FAMILY = Family("mistral_large4", ARCHITECTURES, read_config, abstract_layer, hf_leaves,
                functools.partial(decoder_layer, router=route, attention=large4_attention),
                top_names=("tok_embeddings.weight", "norm.weight"), head_name="output",
                layer_hf_leaves=layer_hf_leaves)
