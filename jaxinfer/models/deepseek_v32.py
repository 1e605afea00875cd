"""DeepSeek-V3.2 and GLM-5 (DeepseekV32ForCausalLM, GlmMoeDsaForCausalLM): DeepSeek-V3 with sparse attention (DSA).

Each layer is DeepSeek-V3's (`models.deepseek`: latent attention, V3's grouped sigmoid routing, dense first layers,
shared experts) with a lightning indexer (`models.lightning_indexer`) choosing the `index_topk` earlier tokens its
latent attention reads (`models.sparse_latent_attention`). The latent attention always rotates adjacent pairs and
always has a low-rank query (q_a_proj), whose normed output the indexer's query reads; the indexer rotates its
first qk_rope_head_dim dims rotate-half (DeepSeek-V3.2) or in adjacent pairs (GLM-5).

Refused by name: GLM-5.2's layers that reuse the last full layer's choice (`indexer_types` "shared", from
`index_topk_freq` / `index_topk_pattern`), MLP layouts other than the first `first_k_dense_replace` dense, and
their MTP layers as drafts (each carries an indexer; `speculative.mtp` refuses architectures outside its
MTP_ARCHITECTURES).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

import jax

from jaxinfer.config.latent_attention import LightningIndexer
from jaxinfer.config.model import ConfigError, ModelConfig, field
from jaxinfer.models.deepseek import V3, DeepseekLayerWeights, DeepseekMoELayerWeights, decoder_layer
from jaxinfer.models.deepseek import abstract_layer as v3_layer
from jaxinfer.models.deepseek import hf_leaves as v3_hf_leaves
from jaxinfer.models.deepseek import read_config as v3_config
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.lightning_indexer import IndexerWeights, indexer_hf_leaves, indexer_leaves
from jaxinfer.models.sparse_latent_attention import sparse_latent_attention

V32, GLM5 = "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"
# The indexed layer's name in the layer_types transformers 5.17's configs write (later ones write "indexed_attention")
OLDER_SPELLINGS = {"deepseek_sparse_attention": "indexed_attention"}
ARCHITECTURES = (V32, GLM5)
_INDEXER = dict(index_topk=2048, index_head_dim=128)
# transformers' DeepseekV32Config / GlmMoeDsaConfig defaults where they differ from DeepseekV3Config's (which
# deepseek's read_config supplies for the rest).
HF_DEFAULTS = {
    V32: {**_INDEXER, "index_n_heads": 64, "max_position_embeddings": 163840},
    GLM5: {**_INDEXER, "index_n_heads": 32, "max_position_embeddings": 202752, "n_group": 1, "topk_group": 1,
           "q_lora_rank": 2048, "qk_nope_head_dim": 192, "v_head_dim": 256, "rms_norm_eps": 1e-5},
}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class DsaLayerWeights(DeepseekLayerWeights, IndexerWeights):
    """A dense layer with the indexer."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class DsaMoELayerWeights(DeepseekMoELayerWeights, IndexerWeights):
    """An MoE layer with the indexer."""


def abstract_layer(cfg: ModelConfig, layer: int) -> Any:
    """DeepSeek-V3's layer leaves (its correction bias too) plus the indexer's."""
    v3 = v3_layer(cfg, layer, correction=True)
    kind = DsaMoELayerWeights if isinstance(v3, DeepseekMoELayerWeights) else DsaLayerWeights
    fields = {f.name: getattr(v3, f.name) for f in dataclasses.fields(v3)}
    return kind(**fields, **indexer_leaves(cfg))


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """DeepSeek-V3's tensor names plus `self_attn.indexer.*`."""
    return {**v3_hf_leaves(cfg, correction=True), **indexer_hf_leaves(cfg)}


def _check_layer_kinds(hf: Mapping[str, Any], arch: str, num_layers: int) -> None:
    """Refuse layer layouts transformers runs differently from every layer indexed, the first
    first_k_dense_replace dense."""
    dense = min(int(field(hf, "first_k_dense_replace", 3)), num_layers)
    kinds = {
        "layer_types": ["indexed_attention"] * num_layers,
        "mlp_layer_types": ["dense"] * dense + ["sparse"] * (num_layers - dense),
        "indexer_types": ["full"] * num_layers,
    }
    for name, expected in kinds.items():
        if field(hf, name) is not None and [OLDER_SPELLINGS.get(k, k) for k in hf[name]] != expected:
            raise ConfigError(f"{name} {hf[name]!r} is not supported for {arch}: its layers are {expected!r} "
                              "(GLM-5.2's layers reusing the last full layer's top-k, 'shared', are not implemented)")
    pattern = field(hf, "index_topk_pattern")
    if int(field(hf, "index_topk_freq", 1)) > 1 or (pattern is not None and set(pattern) - {"F", "full"}):
        raise ConfigError(f"index_topk_freq {hf.get('index_topk_freq')} / index_topk_pattern {pattern!r} is not "
                          f"supported for {arch}: every layer runs its own indexer (index_topk_freq 1)")


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """DeepSeek-V3's reading of the config (its defaults where this architecture's match) plus the indexer."""
    hf = {**HF_DEFAULTS[arch], **{key: value for key, value in hf.items() if value is not None or key == "q_lora_rank"}}
    if not int(field(hf, "q_lora_rank", 0) or 0):
        raise ConfigError(f"q_lora_rank {hf.get('q_lora_rank')!r} is not supported for {arch}: its indexer reads "
                          "the low-rank query (q_lora_rank > 0)")
    _check_layer_kinds(hf, arch, int(hf["num_hidden_layers"]))
    kept = {k: v for k, v in hf.items() if k not in ("layer_types", "mlp_layer_types", "indexer_types")}
    cfg = v3_config({**kept, "rope_interleave": True}, V3)
    indexer = LightningIndexer(
        index_topk=int(hf["index_topk"]), index_head_dim=int(hf["index_head_dim"]),
        index_n_heads=int(hf["index_n_heads"]), rope_interleaved=arch == GLM5,
    )
    if indexer.index_head_dim < cfg.rotary_dim or indexer.index_topk < 1:
        raise ConfigError(f"index_head_dim {indexer.index_head_dim} / index_topk {indexer.index_topk} not supported "
                          f"for {arch}: index_head_dim >= qk_rope_head_dim ({cfg.rotary_dim}), index_topk >= 1")
    mla = dataclasses.replace(cfg.latent_attention, indexer=indexer)
    return dataclasses.replace(cfg, architecture=arch, latent_attention=mla, head_dim=mla.cached_dims)


# DeepSeek-V3's pre-norm block with the sparse latent attention (V3's noaux_tc routing: the layer holds the bias)
FAMILY = Family("deepseek_v32", ARCHITECTURES, read_config, abstract_layer, hf_leaves,
                functools.partial(decoder_layer, attention=sparse_latent_attention))
